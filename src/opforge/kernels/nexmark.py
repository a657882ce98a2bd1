"""Nexmark events in one pass: the kernel behind ``opforge.nexmark_events``.

Each program takes ``BLOCK`` event indices ``j`` of one kind, computes the global
event number, the skewed timestamp and every field from 31-bit hashes of
``n * 8 + seed * 1_000_003 + salt`` in int64 registers, and writes each output row
once: ``len(fields) + 1`` int64 stores per event and one load. The torch reference
makes the same columns in about 25 kernels, each reading and writing whole int64
columns.

All arithmetic is on non-negative int64 values below 2^62 (event numbers times
1000, hashes below 2^31 times a 27-bit constant), so Triton's truncating ``//``
and ``%`` equal torch's floor division and remainder there.
"""

from __future__ import annotations

import triton
import triton.language as tl

# Bump when a kernel's code changes: it invalidates tuned entries of that kernel.
NEXMARK_VERSION = "1"

PROPORTION = tl.constexpr(50)
FIRST_ID = tl.constexpr(1000)
PERSON = tl.constexpr(1)
AUCTION = tl.constexpr(3)
_LOW32 = tl.constexpr(0xFFFFFFFF)
_LOW31 = tl.constexpr(0x7FFFFFFF)
_MULT = tl.constexpr(0x45D9F3B)


@triton.jit
def _hash31(x):
    """``opforge.stream.partitioning.hash_keys`` of non-negative int64 ``x``."""
    h = (x ^ (x >> 32)) & _LOW32
    h = ((h ^ (h >> 16)) * _MULT) & _LOW32
    h = ((h ^ (h >> 16)) * _MULT) & _LOW32
    return (h ^ (h >> 16)) & _LOW31


@triton.jit(do_not_specialize=["count"])
def nexmark_events_kernel(j_ptr, out_ptr, count, seed_term, events_per_second, skew, in_flight, hot_per_mille,
                          KIND: tl.constexpr, LO: tl.constexpr, WIDTH: tl.constexpr, BLOCK: tl.constexpr):
    """Row ``r`` of ``out`` (``count`` wide) is field ``r`` of the events; the last row the timestamps.
    KIND: 0 person (salts 0-2), 1 auction (0, 3-7), 2 bid (0, 8-11)."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inb = rows < count
    j = tl.load(j_ptr + rows, mask=inb, other=0)
    epoch = j // WIDTH
    off = j - epoch * WIDTH + LO
    n = epoch * PROPORTION + off
    x = n * 8 + seed_term
    # late by up to ``skew`` ms, on a timeline that starts at 0 (``skew == 0``: ``u % 1 == 0``)
    ts = n * 1000 // events_per_second + skew - _hash31(x) % (skew + 1)
    last_person = FIRST_ID + epoch * PERSON
    if KIND == 0:
        cols = (last_person + off, _hash31(x + 1) % 50, _hash31(x + 2) % 1000, ts)
    elif KIND == 1:
        initial = 100 + _hash31(x + 3) % 10_000
        cols = (FIRST_ID + epoch * AUCTION + (off - PERSON), FIRST_ID + _hash31(x + 4) % (last_person - FIRST_ID + 1),
                10 + _hash31(x + 5) % 5, initial, initial + _hash31(x + 6) % 1000, ts,
                ts + 10_000 + _hash31(x + 7) % 20_000)
    else:
        last_auction = FIRST_ID + epoch * AUCTION + (AUCTION - 1)
        hot = (_hash31(x + 8) % 1000) < hot_per_mille
        back = _hash31(x + 9) % in_flight
        auction = tl.where(hot, last_auction, tl.maximum(last_auction - back, FIRST_ID))
        cols = (auction, FIRST_ID + _hash31(x + 10) % (last_person - FIRST_ID + 1), 100 + _hash31(x + 11) % 10_000, ts)
    stride = count.to(tl.int64)  # rows of out: fields x count can pass 2^31
    for r in tl.static_range(len(cols)):
        tl.store(out_ptr + r * stride + rows, cols[r], mask=inb)
    tl.store(out_ptr + len(cols) * stride + rows, ts, mask=inb)


# ---------------------------------------------------------------------------
# Launch helpers
# ---------------------------------------------------------------------------
def default_config() -> dict:
    return {"BLOCK": 1024, "num_warps": 4}


def configs() -> list[dict]:
    return [{"BLOCK": b, "num_warps": w} for b, w in ((256, 2), (512, 4), (1024, 4), (1024, 8), (2048, 8))]


def events(j, out, kind: int, lo: int, width: int, seed_term: int, events_per_second: int, skew: int,
           in_flight: int, hot_per_mille: int, cfg) -> None:
    """Fill ``out`` (int64, ``[fields + 1, len(j)]``, contiguous) with the events of indices ``j``
    (int64, contiguous, non-negative)."""
    count = j.numel()
    if not count:
        return
    block = cfg["BLOCK"]
    nexmark_events_kernel[(triton.cdiv(count, block),)](
        j, out, count, seed_term, events_per_second, skew, in_flight, hot_per_mille,
        KIND=kind, LO=lo, WIDTH=width, BLOCK=block, num_warps=cfg.get("num_warps", 4),
    )

"""Waves: one pass over long rows with the second touch of each piece in L2.

A long row (too long for one program) is cut into ``pieces`` programs. Every
piece needs a statistic of the whole row (max and sum for softmax, mean and
variance for a norm) before it can write. Two kernels (stats, then apply)
read HBM twice: the apply kernel starts after the stats kernel has streamed
the whole tensor through L2. A barrier among a row's pieces (``split``) reads
once but leaves programs idle, holding registers, until the row's last piece
is scheduled: bytes in flight drop and bf16 rows stall at ~60 % of copy.

Here rows are grouped into *waves* of ``wave_rows`` rows, and one grid runs
the two roles interleaved in launch order::

    S0  S1 A0  S2 A1  ...  S(W-1) A(W-2)  A(W-1)

``Sk`` (``n = wave_rows * pieces`` programs) reads wave ``k``'s pieces once and
publishes each piece's statistic, then counts itself on wave ``k``'s arrival
counter; ``Ak`` re-reads its piece, which ``Sk`` read one wave earlier and L2
still holds when a wave is a few MB, combines the row's statistics and writes.
An ``Ak`` program waits only for ``Sk``'s programs, launched a whole wave
before it: they are running or done (programs start in launch order), so the
wait is short and cannot deadlock, whatever the number of pieces; under the
interpreter (programs run one by one, in order) it never waits at all.

HBM traffic: one read and one write (the re-read is an L2 hit); no program
holds a piece across a wait, so occupancy stays that of a streaming kernel.

Memory ordering: a stats program stores its statistic, then a CTA barrier
(every thread's store happens before), then a release ``atomic_add`` on the
counter. An apply program polls the counter with acquire atomics, a CTA
barrier, then reads the statistics with volatile (L1-bypassing) loads.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def wave_role(pid, n, W):
    """Program ``pid``'s role (True: stats, False: apply), its wave and its index in the wave."""
    h = pid // n
    idx = pid - h * n
    odd = (h % 2) == 1
    later = (h + 1) // 2
    is_stats = (h == 0) | (odd & (later < W))
    wave = tl.where(h == 0, 0, tl.where(odd, tl.where(later < W, later, W - 1), h // 2 - 1))
    return is_stats, wave, idx


@triton.jit
def wave_arrive(count_ptr, wave):
    """Count this stats program on its wave, after its statistics' stores."""
    tl.debug_barrier()
    tl.atomic_add(count_ptr + wave, 1, sem="release")


@triton.jit
def wave_wait(count_ptr, wave, expected):
    """Wait until ``expected`` stats programs of ``wave`` have arrived."""
    seen = tl.atomic_add(count_ptr + wave, 0, sem="acquire")
    while seen < expected:
        seen = tl.atomic_add(count_ptr + wave, 0, sem="acquire")
    tl.debug_barrier()


# ---------------------------------------------------------------------------
# Packed statistics (fp32 pairs): no counter and no fence. A stats program
# publishes its two values as one 64-bit word with a relaxed atomic exchange
# (single-copy atomic: a reader sees the old word or the new one, whole); the
# apply program polls the row's words with volatile (strong) loads until
# none is PENDING. The values are their own flag, so nothing else needs
# ordering (the input is read-only), and the stats program's release fence
# (a MEMBAR.GPU that holds it for an L2 round trip) is gone.
# ---------------------------------------------------------------------------
# A word not yet published: its high value is -1.0, which no published high
# value (a sum of exponentials, a sum of squares) can be.
PENDING_WORD = (0xBF800000 << 32) - (1 << 64)


@triton.jit
def pack_pair(lo, hi):
    """Two fp32 values as one int64, ``lo`` in the low word."""
    lo_bits = lo.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF
    return lo_bits | (hi.to(tl.int32, bitcast=True).to(tl.int64) << 32)


@triton.jit
def unpack_pair(w):
    lo = (w & 0xFFFFFFFF).to(tl.int32).to(tl.float32, bitcast=True)
    hi = (w >> 32).to(tl.int32).to(tl.float32, bitcast=True)
    return lo, hi


@triton.jit
def wave_publish_pair(word_ptr, lo, hi):
    tl.atomic_xchg(word_ptr, pack_pair(lo, hi), sem="relaxed")


@triton.jit
def wave_gather_pairs(word_ptr, mask):
    """The published pairs at ``word_ptr`` (a vector; masked lanes read 0, 0),
    once none is pending."""
    w = tl.load(word_ptr, mask=mask, other=0, volatile=True)
    lo, hi = unpack_pair(w)
    pending = tl.sum((mask & (hi == -1.0)).to(tl.int32), axis=0)
    while pending > 0:
        w = tl.load(word_ptr, mask=mask, other=0, volatile=True)
        lo, hi = unpack_pair(w)
        pending = tl.sum((mask & (hi == -1.0)).to(tl.int32), axis=0)
    return lo, hi


def pending_words(count: int, device):
    import torch

    return torch.full((count,), PENDING_WORD, dtype=torch.int64, device=device)


def wave_plan(rows: int, pieces: int, wave_rows: int) -> tuple[int, int, int]:
    """``(wave_rows, waves, programs)``: the grid is two programs (stats and
    apply) per piece of each wave, full waves of ``wave_rows`` rows."""
    wave_rows = max(1, min(wave_rows, rows))
    waves = triton.cdiv(rows, wave_rows)
    return wave_rows, waves, 2 * waves * wave_rows * pieces


def wave_rows_for(row_bytes: int, target_bytes: int = 4 << 20) -> int:
    """Rows per wave: about ``target_bytes`` of input a wave. L2 (50 MB on the
    H200) holds a wave awaiting its re-read, the next one being read and the
    writes of the one before: 4 MiB waves ran fastest (2, 6, 8, 16 and 32 MiB
    slower) at 1024x65536 and 1024x262144 bf16 (H200, 2026-12-02, rows_scan.py)."""
    return max(1, target_bytes // max(row_bytes, 1))


def wave_counters(waves: int, device):
    import torch

    return torch.zeros(waves, dtype=torch.int32, device=device)

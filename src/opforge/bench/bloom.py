"""Bench cases for the blocked Bloom filter probe (``opforge.blocked_bloom_probe``): the SQL
engine's runtime filter applied to a probe-side key column.

Bytes are the fewest the op must move: each key read once, one 32-byte sector of the filter
per key (a block: the filter is far larger than the L2 cache at these sizes, so each probe
is a random sector read), one byte written per key (plus the validity byte read, when there
is a mask). FLOPs: 0 (hashing is integer work; the op is bandwidth-bound). A filter that fits
in the L2 cache (50 MB on an H200: the 16 MB filter of a 10M-key build side) serves many of those
sectors from L2, so the op can beat that DRAM floor there; the 50M-key build side's 64 MB filter
does not fit.

Peer: torch eager, the reference (today's runtime filter: about 20 torch ops on int64
temporaries: mix64, shifts, stack, gather, all).
"""

from __future__ import annotations

import torch

from opforge.bench.case import BenchCase
from opforge.ops import bloom as B

SECTOR_BYTES = 32
BITS_PER_KEY = 10


def probe_case(n_build: int, n_probe: int, *, dtype: torch.dtype = torch.int32, hashes: int = 3,
               with_valid: bool = False, label: str | None = None) -> BenchCase:
    """Build keys: a random sample of ``[0, 4 * n_build)``; probe keys uniform in
    ``[0, 8 * n_build)`` (about 1/8 inserted); range [min, max] of the build keys, as the
    runtime filter passes it."""
    bits = max(1, n_build) * BITS_PER_KEY
    blocks = 1 << max(0, (-(-bits // (64 * B.BLOCK_WORDS)) - 1).bit_length())

    def make(dev):
        g = torch.Generator(device="cpu").manual_seed(12)
        build = torch.randint(0, 4 * n_build, (n_build,), generator=g, dtype=torch.int64)
        words = B.build_words(build.to(dev), blocks, hashes)
        keys = torch.randint(0, 8 * n_build, (n_probe,), generator=g, dtype=torch.int64).to(dtype).to(dev)
        lo, hi = int(build.min()), int(build.max())
        if with_valid:
            return (words, keys, hashes, lo, hi, (torch.rand(n_probe, generator=g) > 0.05).to(dev))
        return (words, keys, hashes, lo, hi)

    def run(*args):
        return B.blocked_bloom_probe(*args)

    def reference(*args):
        return B.REFERENCE["blocked_bloom_probe"](*args)

    es = torch.tensor([], dtype=dtype).element_size()
    nbytes = n_probe * (es + SECTOR_BYTES + 1 + (1 if with_valid else 0))
    name = label or f"{n_build}->{n_probe} k={hashes}{' null' if with_valid else ''}"
    return BenchCase(
        op="blocked_bloom_probe", label=name, dtype=dtype, make_args=make, run=run, reference=reference,
        flops=0, nbytes=nbytes, peers={"torch eager": reference},
        op_args=lambda *a: tuple(a) if len(a) == 6 else (*a, None), upcast_reference=False,
    )


def cases(device: torch.device, quick: bool) -> list[BenchCase]:
    """The runtime filter of a 10M-row build side over a 60M-row probe column (the SQL engine's
    case), int32 and int64 keys, with a NULL mask; a 50M-row build side (a filter past L2)."""
    if quick or device.type != "cuda":
        return [
            probe_case(2000, 20000),
            probe_case(2000, 20000, dtype=torch.int64, hashes=7, with_valid=True),
        ]
    return [
        probe_case(10_000_000, 60_000_000),
        probe_case(10_000_000, 60_000_000, dtype=torch.int64),
        probe_case(10_000_000, 60_000_000, with_valid=True),
        probe_case(50_000_000, 60_000_000),
    ]

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
still holds when a wave is ~8 MB, combines the row's statistics and writes.
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


def wave_plan(rows: int, pieces: int, wave_rows: int) -> tuple[int, int, int]:
    """``(wave_rows, waves, programs)``: the grid is two programs (stats and
    apply) per piece of each wave, full waves of ``wave_rows`` rows."""
    wave_rows = max(1, min(wave_rows, rows))
    waves = triton.cdiv(rows, wave_rows)
    return wave_rows, waves, 2 * waves * wave_rows * pieces


def wave_rows_for(row_bytes: int, target_bytes: int = 8 << 20) -> int:
    """Rows per wave: about ``target_bytes`` of input a wave. L2 (50 MB on the
    H200) holds a wave awaiting its re-read, the next one being read and the
    writes of the one before: 8 MiB waves ran faster than 16 and 32 MiB ones
    at 1024x65536 and 1024x262144 bf16 (H200, 2026-12-02, rows_scan.py)."""
    return max(1, target_bytes // max(row_bytes, 1))


def wave_counters(waves: int, device):
    import torch

    return torch.zeros(waves, dtype=torch.int32, device=device)

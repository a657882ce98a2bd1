"""Embedding kernels: the row gather (forward) and a deterministic backward.

Forward: one program per ``(token, column block)`` copies row ``ids[token]``
of the table. Backward: the ids are sorted first (outside, ``torch.sort``:
``perm`` gives each sorted slot's token); a program whose slot starts a run of
equal ids walks the run in order, sums those tokens' gradient rows in fp32
(fp64 for fp64) and writes the table row once, rounded once. No atomics, so
the result is bitwise reproducible, and no fp32 table-sized buffer (the
gradient is written in the table's dtype). Rows no token uses stay as the
caller allocated them (zeros); ``padding_idx`` rows are skipped.
"""

from __future__ import annotations

import triton
import triton.language as tl

from opforge.runtime.launch import launch
from opforge.runtime.shapes import pow2

VERSION = "1"


@triton.jit
def gather_kernel(ids_ptr, w_ptr, out_ptr, H, w_row, out_row, BLOCK: tl.constexpr):
    tok = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < H
    row = tl.load(ids_ptr + tok).to(tl.int64)
    tl.store(out_ptr + tok * out_row + cols, tl.load(w_ptr + row * w_row + cols, mask=mask), mask=mask)


@triton.jit
def scatter_sorted_kernel(sorted_ptr, perm_ptr, g_ptr, dw_ptr, N, H, g_row, dw_row, padding_idx,
                          BLOCK: tl.constexpr, FP64: tl.constexpr):
    slot = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < H
    row = tl.load(sorted_ptr + slot)
    prev = tl.load(sorted_ptr + tl.maximum(slot - 1, 0))
    if ((slot == 0) | (prev != row)) & (row != padding_idx):
        acc = tl.zeros((BLOCK,), dtype=tl.float64 if FP64 else tl.float32)
        j = slot
        same = row == row  # a tensor from the start: a loop-carried value keeps one type
        while same:
            tok = tl.load(perm_ptr + j).to(tl.int64)
            acc += tl.load(g_ptr + tok * g_row + cols, mask=mask, other=0.0).to(acc.dtype)
            j += 1
            nxt = tl.load(sorted_ptr + tl.minimum(j, N - 1))
            same = (j < N) & (nxt == row)
        tl.store(dw_ptr + row.to(tl.int64) * dw_row + cols, acc.to(dw_ptr.dtype.element_ty), mask=mask)


def default_config(hidden: int) -> dict:
    return {"BLOCK": min(pow2(max(hidden, 1)), 1024), "num_warps": 4}


def configs(hidden: int) -> list[dict]:
    return [{"BLOCK": b, "num_warps": w} for b in (256, 512, 1024) if b <= max(pow2(hidden), 256) for w in (2, 4, 8)]


def launch_gather(ids, weight, out, cfg) -> None:
    n, h = ids.numel(), weight.shape[1]
    if n and h:
        launch(gather_kernel, (n, triton.cdiv(h, cfg["BLOCK"])), ids, weight, out, h, weight.stride(0),
               out.stride(0), BLOCK=cfg["BLOCK"], num_warps=cfg["num_warps"])


def launch_scatter_sorted(sorted_ids, perm, grad, dw, padding_idx: int, cfg) -> None:
    n, h = sorted_ids.numel(), dw.shape[1]
    if n and h:
        launch(scatter_sorted_kernel, (n, triton.cdiv(h, cfg["BLOCK"])), sorted_ids, perm, grad, dw, n, h,
               grad.stride(0), dw.stride(0), padding_idx, BLOCK=cfg["BLOCK"], FP64=dw.element_size() == 8,
               num_warps=cfg["num_warps"])

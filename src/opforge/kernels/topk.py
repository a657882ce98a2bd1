"""Top-k over the last dim of ``[rows, cols]`` rows held in registers.

One program owns ``BLOCK_R`` whole rows; ``k`` rounds each pick the row's
maximum (ties: the lowest index, so the order is deterministic) and mask it
out. Cost ``k`` register passes over the row: meant for the small ``k`` of
MoE gating and sampling (``k <= MAX_K``) over rows up to ``ROW_LIMIT``.
Values are compared in fp32 (fp64 for fp64); NaN counts as the largest, as
in torch. ``largest=False`` negates on load.
"""

from __future__ import annotations

import triton
import triton.language as tl

from opforge.runtime.launch import launch
from opforge.runtime.shapes import pow2

VERSION = "1"
ROW_LIMIT = 4096
MAX_K = 64


@triton.jit
def topk_kernel(x_ptr, v_ptr, i_ptr, R, C, x_row, K: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
                LARGEST: tl.constexpr, FP64: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_C)
    rmask = rows < R
    mask = rmask[:, None] & (cols < C)[None, :]
    x = tl.load(x_ptr + rows[:, None].to(tl.int64) * x_row + cols[None, :], mask=mask)
    compute = tl.float64 if FP64 else tl.float32
    x = x.to(compute)
    if not LARGEST:
        x = -x
    x = tl.where(x != x, float("inf"), x)  # NaN ranks first, as in torch
    x = tl.where(mask, x, float("-inf"))
    taken = (rows[:, None] < 0) & (cols[None, :] < 0)  # all false, in the loop's shape
    for j in range(K):
        cand = tl.where(taken, float("-inf"), x)
        best = tl.max(cand, axis=1)
        hit = (cand == best[:, None]) & ~taken & (cols < C)[None, :]
        idx = tl.min(tl.where(hit, cols[None, :], BLOCK_C), axis=1)
        taken = taken | (cols[None, :] == idx[:, None])
        val = tl.load(x_ptr + rows.to(tl.int64) * x_row + idx, mask=rmask)
        tl.store(v_ptr + rows * K + j, val, mask=rmask)
        tl.store(i_ptr + rows * K + j, idx.to(tl.int64), mask=rmask)


def default_config(rows: int, cols: int) -> dict:
    block_c = pow2(max(cols, 1))
    return {"BLOCK_R": max(1, min(16, 2048 // block_c)), "num_warps": 4 if block_c >= 1024 else 2}


def configs(rows: int, cols: int) -> list[dict]:
    block_c = pow2(max(cols, 1))
    return [{"BLOCK_R": r, "num_warps": w} for r in (1, 4, 16) if r * block_c <= 16384 for w in (1, 2, 4)]


def launch_topk(x, values, indices, k: int, largest: bool, cfg) -> None:
    """``x`` is ``[rows, cols]`` with unit column stride; outputs ``[rows, k]`` contiguous."""
    rows, cols = x.shape
    if rows == 0 or k == 0:
        return
    launch(topk_kernel, (triton.cdiv(rows, cfg["BLOCK_R"]),), x, values, indices, rows, cols, x.stride(0),
           K=k, BLOCK_R=cfg["BLOCK_R"], BLOCK_C=pow2(cols), LARGEST=largest, FP64=x.element_size() == 8,
           num_warps=cfg["num_warps"])

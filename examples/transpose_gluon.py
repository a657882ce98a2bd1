"""The transpose ladder's Gluon steps: layouts written out, so ``opforge.layout`` can
say what each memory instruction costs before ncu measures it.

Every kernel moves a ``32 x 32`` fp32 tile per program with 4 warps, each thread
one 4-byte element per instruction (``BlockedLayout([1, 1], [1, 32], [4, 1])``:
a warp's 32 lanes along a row), so each instruction is one warp request of
32 x 4 bytes:

* ``naive``: loads a tile along the rows of ``x`` and stores it with the same
  layout into ``y = x.T``: the lanes of a store are ``M * 4`` bytes apart.
* ``shared, unpadded``: stages the tile in shared memory as a plain row-major
  ``32 x 32`` tile and reads it back down the columns: all 32 lanes in one bank.
* ``shared, padded``: the tile's rows padded by one word, ``(32,32):(33,1)``.
* ``shared, swizzled``: the tile swizzled by ``Swizzle<5,0,5>`` (column index
  XOR row index), Gluon's ``SwizzledSharedLayout(1, 1, 32)``.

The shared layouts come from ``opforge.layout`` (``gluon.swizzle_params``,
``gluon.padding_params``); ``accesses(kind, m, n)`` is the analyzer's model of
one program's instructions (``opforge.layout.analyze``). Gluon has no
interpreter: without CUDA these kernels only compile (for sm_90).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from opforge.layout import Layout, Swizzle
from opforge.layout import analyze as A
from opforge.layout import gluon as G

TILE = 32
WARPS = 4
PADDED = Layout((TILE, TILE), (TILE + 1, 1))
UNPADDED = Layout((TILE, TILE), (TILE, 1))
SWIZZLE = Swizzle(5, 0, 5)
KINDS = ("naive", "unpadded", "padded", "swizzled")


@gluon.jit
def _tile_offsets(tile_r, tile_c, BR: gl.constexpr, BC: gl.constexpr, layout: gl.constexpr):
    """Row and column indices (as a column and a row) of tile (tile_r, tile_c) in ``layout``."""
    r = tile_r * BR + gl.arange(0, BR, layout=gl.SliceLayout(1, layout))
    c = tile_c * BC + gl.arange(0, BC, layout=gl.SliceLayout(0, layout))
    return r[:, None], c[None, :]


@gluon.jit
def transpose_gluon_naive_kernel(x_ptr, y_ptr, M, N, BM: gl.constexpr, BN: gl.constexpr, NW: gl.constexpr):
    rows: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [NW, 1], [1, 0])
    rm, rn = _tile_offsets(gl.program_id(0), gl.program_id(1), BM, BN, rows)
    mask = (rm < M) & (rn < N)
    tile = gl.load(x_ptr + rm * N + rn, mask=mask)
    gl.store(y_ptr + rn * M + rm, tile, mask=mask)  # lanes M elements apart


@gluon.jit
def _transpose_through_shared(x_ptr, y_ptr, M, N, BM: gl.constexpr, BN: gl.constexpr, NW: gl.constexpr,
                              smem_layout: gl.constexpr):
    rows: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [NW, 1], [1, 0])
    rm, rn = _tile_offsets(gl.program_id(0), gl.program_id(1), BM, BN, rows)
    tile = gl.load(x_ptr + rm * N + rn, mask=(rm < M) & (rn < N))
    smem = gl.allocate_shared_memory(gl.float32, [BM, BN], smem_layout)
    smem.store(tile)
    turned = smem.permute([1, 0]).load(rows)  # [BN, BM]: lanes walk down a column of the tile
    tn, tm = _tile_offsets(gl.program_id(1), gl.program_id(0), BN, BM, rows)
    gl.store(y_ptr + tn * M + tm, turned, mask=(tn < N) & (tm < M))


@gluon.jit
def transpose_gluon_padded_kernel(x_ptr, y_ptr, M, N, BM: gl.constexpr, BN: gl.constexpr, NW: gl.constexpr,
                                  INTERVAL: gl.constexpr, PAD: gl.constexpr):
    smem_layout: gl.constexpr = gl.PaddedSharedLayout.with_identity_for([[INTERVAL, PAD]], [BM, BN], [1, 0])
    _transpose_through_shared(x_ptr, y_ptr, M, N, BM, BN, NW, smem_layout)


@gluon.jit
def transpose_gluon_swizzled_kernel(x_ptr, y_ptr, M, N, BM: gl.constexpr, BN: gl.constexpr, NW: gl.constexpr,
                                    VEC: gl.constexpr, PER_PHASE: gl.constexpr, MAX_PHASE: gl.constexpr):
    smem_layout: gl.constexpr = gl.SwizzledSharedLayout(VEC, PER_PHASE, MAX_PHASE, [1, 0])
    _transpose_through_shared(x_ptr, y_ptr, M, N, BM, BN, NW, smem_layout)


def launch_args(kind: str) -> tuple:
    """(kernel, its constexpr keyword arguments) of a step."""
    base = {"BM": TILE, "BN": TILE, "NW": WARPS, "num_warps": WARPS}
    if kind == "naive":
        return transpose_gluon_naive_kernel, base
    if kind == "swizzled":
        vec, per_phase, max_phase = G.swizzle_params(SWIZZLE, TILE, TILE)
        return transpose_gluon_swizzled_kernel, dict(base, VEC=vec, PER_PHASE=per_phase, MAX_PHASE=max_phase)
    if kind in ("padded", "unpadded"):
        # unpadded: one pad word per whole tile, i.e. none inside it (a plain tile in the
        # PaddedSharedLayout form, so the compiler emits the same st/ld.shared as the padded step)
        interval, pad = G.padding_params(PADDED) if kind == "padded" else (TILE * TILE, 1)
        return transpose_gluon_padded_kernel, dict(base, INTERVAL=interval, PAD=pad)
    raise ValueError(f"transpose_gluon: kind must be one of {KINDS}, got {kind!r}")


def shared_tile(kind: str):
    """The shared tile's layout, coordinates (row, col) -> element offset."""
    if kind == "swizzled":
        return G.swizzled_tile(SWIZZLE, TILE, TILE)
    return {"padded": PADDED, "unpadded": UNPADDED}[kind]


def accesses(kind: str, m: int, n: int) -> list:
    """The analyzer's model of one program's memory instructions (every program is alike
    when ``m`` and ``n`` are multiples of the tile)."""
    # (lane, request) -> tile coordinate, column-major over (row, col) of the 32x32 tile:
    # along a row (lane -> col), requests over warps then registers (-> row)
    along_rows = Layout((32, (WARPS, TILE // WARPS)), (TILE, (1, WARPS)))
    # the transposed read: lane -> row, requests -> col
    down_cols = Layout((32, (WARPS, TILE // WARPS)), (1, (TILE, TILE * WARPS)))
    x_tile = Layout((TILE, TILE), (n, 1))
    y_tile = Layout((TILE, TILE), (1, m))  # y[c, r] for tile element (r, c)
    out = [A.tile_access("load x", "global", "ld", along_rows, x_tile, element_bytes=4)]
    if kind == "naive":
        return out + [A.tile_access("store y", "global", "st", along_rows, y_tile, element_bytes=4)]
    smem = shared_tile(kind)
    return out + [A.tile_access("store tile", "shared", "st", along_rows, smem, element_bytes=4),
                  A.tile_access("load tile.T", "shared", "ld", down_cols, smem, element_bytes=4),
                  A.tile_access("store y", "global", "st", down_cols, y_tile, element_bytes=4)]


def launch(kind: str, x, y) -> None:
    import triton

    m, n = x.shape
    kernel, kw = launch_args(kind)
    kernel[(triton.cdiv(m, TILE), triton.cdiv(n, TILE))](x, y, m, n, **kw)


def ncu_step(kind: str, m: int, n: int):
    """The step ``benchmarks/layout_ncu.py`` profiles: one launch of a kind on CUDA tensors."""
    import torch

    x = torch.randn(m, n, device="cuda")
    y = torch.empty(n, m, device="cuda")
    return lambda: launch(kind, x, y)

"""Transpose and permute as data moves: ``y = x.permute(perm).contiguous()``.

Planning (host side, ``plan``). The output is dense, so its strides follow
from its shape; the input is read through its own strides, taken in output
order (``in_stride[i] = x.stride(perm[i])``). Size-1 dims are dropped and
adjacent output dims ``i, i+1`` are merged whenever the input also steps
through them as one (``in_stride[i] == in_stride[i+1] * size[i+1]``). What is
left is the smallest list of ``(size, in_stride)`` pairs that describes the
move; a contiguous input with an identity permutation collapses to one dim
(a flat copy), ``x.t()`` of a matrix to two, and ``[B, R, M, C] -> [B, C, M,
R]`` to four at most. Every tensor is viewed as the signed integer type of
its element size first (``bool``, floats, 8-bit floats alike): the kernels
move bits, so NaN payloads, signed zeros and infinities come out bit-exact,
and one compiled kernel serves every dtype of a size.

Two kernels:

* ``tiled`` (a true transpose: the input's unit-stride dim ``C`` is not the
  output's innermost dim ``R``). The move is a batched 2-D transpose: a
  program loads a ``[TILE_R, TILE_C]`` tile with ``C`` fastest (the input's
  contiguous direction), transposes it with ``tl.trans`` and stores the
  ``[TILE_C, TILE_R]`` result with ``R`` fastest (the output's contiguous
  direction). Triton's coalesce pass gives each memory op its own blocked
  layout, ordered by the pointer's contiguity (``order=[1, 0]`` for the load,
  the reverse for the store after ``tl.trans``), and ``tl.trans`` only
  permutes the register layout; the two layouts differ, so the compiler
  inserts one ``ttg.convert_layout``, which it lowers through shared memory
  (the backend chooses the shared layout's swizzle to limit bank conflicts;
  not measured here: this module was written without a GPU).
  Both global accesses are then 16-byte vectors per thread when sizes and
  strides are multiples of 16 (Triton specializes such ints), and a warp
  covers whole 32-byte sectors on both sides. Checked by compiling for
  sm_90 with triton 3.6 (no GPU needed up to the cubin): for a 64x64 int32
  tile the TTGIR loads ``[R, C]`` in ``blocked<sizePerThread=[1, 4],
  order=[1, 0]>``; ``tt.trans`` yields ``[C, R]`` in ``sizePerThread=[4,
  1], order=[0, 1]`` (a register relabelling); one ``convert_layout`` (16
  KiB of shared memory) takes it to ``sizePerThread=[1, 4], order=[1, 0]``
  for the store. The PTX has ``ld.global.v4.b32`` and ``st.global.v4.b32``
  and no local memory (no spills); likewise for the 1-, 2- and 8-byte
  tiles below and every config ``tiled_configs`` and ``gather_configs``
  produce for the bench shapes. Tiles are 64x64 for 4-byte elements,
  64x128 for 2-byte, 128x128 for 1-byte, 32x64 for 8-byte (16 KiB of data,
  one shared-memory buffer of that size per program); when ``R`` or
  ``C`` is small (a ``[N, 3]`` matrix) the small side is padded to the next
  power of two and the other side grows, so a program still moves ~16 KiB.
  Up to three other dims ride along as batch dims with any strides: each
  program decodes its batch index once (scalar div/mod) and adds two base
  offsets. Program order: ``C`` tiles fastest, then ``R`` tiles, then batch.
* ``gather`` (a strided copy, or any layout the tiled kernel does not take):
  the output is walked as ``[rows, C]`` rows of its innermost dim, with ``C``
  read at stride ``in_sc`` (1 when the innermost dim stays innermost, e.g.
  ``[8192, 64, 1024].transpose(0, 1)``: contiguous chunks of 1024 on both
  sides, full-width vectors). The row index is decoded into up to five input
  dims once per row (not per element), so a program of ``[BLOCK_R,
  BLOCK_C]`` elements spends its integer work on ``BLOCK_R`` rows only.
  Long rows are split across programs along ``C``. Writes are always dense
  and coalesced; reads are too when ``in_sc == 1``, and otherwise stay
  inside a small window that L1 serves (tiny transposes like ``[N, 3, 7]``
  -> ``[N, 7, 3]``, where a transpose tile would be mostly padding).

Offsets are 64-bit (``INT64``) when the output or the input's reach comes
within a tile of 2^31 elements; program ids stay 32-bit (there are fewer
than 2^31 programs).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import triton
import triton.language as tl

# Bump when a kernel's code changes: it invalidates tuned entries of that kernel.
TILED_VERSION = "1"
GATHER_VERSION = "1"

# The tiled kernel takes at most this many batch dims besides R and C; the
# gather kernel at most this many dims in all (after merging).
TILED_MAX_BATCH = 3
GATHER_MAX_DIMS = 6
# Below this many elements in one R x C plane a transpose tile is mostly
# padding: the gather kernel, which packs many planes per program, takes it.
TILED_MIN_PLANE = 1024
# Bytes a program moves by default (16 KiB: enough in flight per SM at a few
# programs each, one shared-memory buffer, no spills); programs wanted to fill
# 132 SMs four deep before tiles shrink.
TILE_BYTES = 16384
TARGET_PROGRAMS = 4 * 132

_INT32_MAX = 2**31 - 1


# ---------------------------------------------------------------------------
# Kernels
# ---------------------------------------------------------------------------
@triton.jit
def tiled_kernel(
    x_ptr, y_ptr, R, C, in_sr, out_sc, tiles_r, tiles_c,
    B1, B2, ib0, ib1, ib2, ob0, ob1, ob2,
    TILE_R: tl.constexpr, TILE_C: tl.constexpr, INT64: tl.constexpr,
):
    pid = tl.program_id(0)
    tc = pid % tiles_c
    t = pid // tiles_c
    tr = t % tiles_r
    b = t // tiles_r
    b2 = b % B2
    b = b // B2
    b1 = b % B1
    b0 = b // B1
    if INT64:
        b0, b1, b2 = b0.to(tl.int64), b1.to(tl.int64), b2.to(tl.int64)
        tr, tc = tr.to(tl.int64), tc.to(tl.int64)
    r = tr * TILE_R + tl.arange(0, TILE_R)
    c = tc * TILE_C + tl.arange(0, TILE_C)
    x_base = x_ptr + (b0 * ib0 + b1 * ib1 + b2 * ib2)
    y_base = y_ptr + (b0 * ob0 + b1 * ob1 + b2 * ob2)
    # Load coalesced along C (the input's unit-stride dim) ...
    load_mask = (r[:, None] < R) & (c[None, :] < C)
    tile = tl.load(x_base + r[:, None] * in_sr + c[None, :], mask=load_mask)
    # ... store coalesced along R (the output's unit-stride dim); the layout
    # change between the two goes through shared memory.
    store_mask = (c[:, None] < C) & (r[None, :] < R)
    tl.store(y_base + c[:, None] * out_sc + r[None, :], tl.trans(tile), mask=store_mask)


@triton.jit
def gather_kernel(
    x_ptr, y_ptr, rows, C, in_sc, tiles_c,
    E0, E1, E2, E3, t0, t1, t2, t3, t_last,
    NROW: tl.constexpr, UNIT_C: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, INT64: tl.constexpr,
):
    pid = tl.program_id(0)
    tc = pid % tiles_c
    tr = pid // tiles_c
    if INT64:
        tr, tc = tr.to(tl.int64), tc.to(tl.int64)
    r = tr * BLOCK_R + tl.arange(0, BLOCK_R)
    c = tc * BLOCK_C + tl.arange(0, BLOCK_C)
    # Decode each row into the input's row dims (innermost first: sizes E*,
    # strides t*; the outermost one needs no modulo). Once per row.
    rem = r
    off = r * 0
    if NROW >= 2:
        q = rem // E0
        off += (rem - q * E0) * t0
        rem = q
    if NROW >= 3:
        q = rem // E1
        off += (rem - q * E1) * t1
        rem = q
    if NROW >= 4:
        q = rem // E2
        off += (rem - q * E2) * t2
        rem = q
    if NROW >= 5:
        q = rem // E3
        off += (rem - q * E3) * t3
        rem = q
    off += rem * t_last
    mask = (r[:, None] < rows) & (c[None, :] < C)
    if UNIT_C:
        src = x_ptr + off[:, None] + c[None, :]
    else:
        src = x_ptr + off[:, None] + c[None, :] * in_sc
    vals = tl.load(src, mask=mask)
    tl.store(y_ptr + r[:, None] * C + c[None, :], vals, mask=mask)


# ---------------------------------------------------------------------------
# Planning (pure Python on shapes and strides; cached per layout)
# ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Plan:
    """The move after merging: ``dims`` are ``(size, in_stride)`` in output
    order (the output is dense), never empty (a single element is ``[(1, 1)]``)."""

    dims: tuple[tuple[int, int], ...]
    numel: int
    reach: int  # 1 + the largest input offset read

    @property
    def out_strides(self) -> tuple[int, ...]:
        out, acc = [], 1
        for size, _ in reversed(self.dims):
            out.append(acc)
            acc *= size
        return tuple(reversed(out))

    @functools.cached_property
    def tiled(self) -> "TiledGeometry | str":
        """``tiled_geometry(self)``, computed once per cached plan (the hot path reads it)."""
        return tiled_geometry(self)


@functools.lru_cache(maxsize=4096)
def plan(shape: tuple[int, ...], strides: tuple[int, ...], perm: tuple[int, ...]) -> Plan:
    """Merge the permuted view of a tensor (``shape``/``strides`` of the input)."""
    numel = 1
    for s in shape:
        numel *= s
    reach = 1 + sum((s - 1) * abs(st) for s, st in zip(shape, strides) if s > 0)
    dims: list[tuple[int, int]] = []
    for p in perm:
        size, stride = shape[p], strides[p]
        if size == 1:
            continue
        if dims and dims[-1][1] == stride * size:
            dims[-1] = (dims[-1][0] * size, stride)
        else:
            dims.append((size, stride))
    return Plan(tuple(dims) or ((1, 1),), numel, reach)


@dataclass(frozen=True)
class TiledGeometry:
    R: int  # the output's innermost dim
    C: int  # the input's unit-stride dim
    in_sr: int  # input stride of R
    out_sc: int  # output stride of C
    batch: tuple[tuple[int, int, int], ...]  # (size, in_stride, out_stride), outermost first

    @property
    def planes(self) -> int:
        n = 1
        for size, _, _ in self.batch:
            n *= size
        return n


def tiled_geometry(p: Plan) -> TiledGeometry | str:
    """The batched 2-D transpose of ``p``, or why the tiled kernel does not take it."""
    R, in_sr = p.dims[-1]
    if in_sr == 1 or len(p.dims) < 2:
        return "the innermost dim stays innermost (a strided copy, not a transpose)"
    unit = [i for i, (size, stride) in enumerate(p.dims[:-1]) if stride == 1]
    if not unit:
        return "no input dim has unit stride (nothing to read coalesced)"
    k = unit[-1]
    C = p.dims[k][0]
    if R * C < TILED_MIN_PLANE:
        return f"an R x C plane of {R}x{C} is under {TILED_MIN_PLANE} elements (mostly padding in a tile)"
    out_strides = p.out_strides
    batch = tuple((size, stride, out_strides[i]) for i, (size, stride) in enumerate(p.dims)
                  if i not in (k, len(p.dims) - 1))
    if len(batch) > TILED_MAX_BATCH:
        return f"{len(batch)} batch dims after merging exceed {TILED_MAX_BATCH}"
    return TiledGeometry(R, C, in_sr, out_strides[k], batch)


def gather_check(p: Plan) -> str | None:
    if len(p.dims) > GATHER_MAX_DIMS:
        return f"{len(p.dims)} dims after merging exceed {GATHER_MAX_DIMS}"
    return None


def needs_int64(p: Plan, tile: int) -> bool:
    return max(p.numel, p.reach) + tile > _INT32_MAX


# ---------------------------------------------------------------------------
# Configs
# ---------------------------------------------------------------------------
_BASE_TILE = {1: (128, 128), 2: (64, 128), 4: (64, 64), 8: (32, 64)}


def _p2(n: int) -> int:
    return triton.next_power_of_2(max(int(n), 1))


def _fit_tile(tr: int, tc: int, R: int, C: int, planes: int, shrink: bool = True) -> tuple[int, int]:
    """Clip a tile to the plane, grow the other side when one side is small,
    then halve it (not below 1024 elements) until there are enough programs."""
    elems = tr * tc
    tc = min(tc, _p2(C))
    tr = min(_p2(R), max(tr, elems // tc))
    tc = min(_p2(C), max(tc, elems // tr))
    while shrink and tr * tc > 1024:
        programs = planes * triton.cdiv(R, tr) * triton.cdiv(C, tc)
        if programs >= TARGET_PROGRAMS:
            break
        if tr >= tc and tr > 16:
            tr //= 2
        elif tc > 16:
            tc //= 2
        else:
            break
    return tr, tc


def _warps(elems: int) -> int:
    return 4 if elems <= 4096 else 8


def tiled_default_config(g: TiledGeometry, es: int) -> dict:
    tr, tc = _BASE_TILE[es]
    tr, tc = _fit_tile(tr, tc, g.R, g.C, g.planes)
    return {"TILE_R": tr, "TILE_C": tc, "num_warps": _warps(tr * tc)}


def tiled_configs(g: TiledGeometry, es: int) -> list[dict]:
    out = []
    for tr, tc in ((32, 32), (64, 64), (32, 128), (128, 32), (64, 128), (128, 64), (128, 128)):
        if tr * tc * es > 32768:
            continue
        tr, tc = _fit_tile(tr, tc, g.R, g.C, g.planes, shrink=False)
        for w in (4, 8):
            cfg = {"TILE_R": tr, "TILE_C": tc, "num_warps": w}
            if cfg not in out and tr * tc >= 32 * w:
                out.append(cfg)
    return out or [tiled_default_config(g, es)]


def gather_default_config(p: Plan, es: int, tile_bytes: int = TILE_BYTES) -> dict:
    C = p.dims[-1][0]
    rows = p.numel // C if C else 0
    elems = tile_bytes // es
    bc = min(_p2(C), elems)
    br = min(_p2(rows), max(1, elems // bc))
    while br * bc > 1024 and triton.cdiv(rows, br) * triton.cdiv(C, bc) < TARGET_PROGRAMS:
        if br > 1:
            br //= 2
        else:
            bc //= 2
    return {"BLOCK_R": br, "BLOCK_C": bc, "num_warps": _warps(br * bc)}


def gather_configs(p: Plan, es: int) -> list[dict]:
    out = []
    for tb in (4096, 16384, 32768):
        base = gather_default_config(p, es, tb)
        for w in (4, 8):
            cfg = dict(base, num_warps=w)
            if cfg not in out and base["BLOCK_R"] * base["BLOCK_C"] >= 32 * w:
                out.append(cfg)
    return out or [gather_default_config(p, es)]


# ---------------------------------------------------------------------------
# Launch helpers. ``x`` and ``y`` are integer views of the input and of the
# dense output (same element size); ``p`` is ``plan`` of ``x`` and the perm.
# ---------------------------------------------------------------------------
def launch_tiled(x, y, p: Plan, g: TiledGeometry, config: dict) -> None:
    if p.numel == 0:
        return
    tr, tc = config.get("TILE_R", 64), config.get("TILE_C", 64)
    batch = list(g.batch)
    while len(batch) < TILED_MAX_BATCH:
        batch.insert(0, (1, 0, 0))
    (B0, ib0, ob0), (B1, ib1, ob1), (B2, ib2, ob2) = batch
    tiles_r, tiles_c = triton.cdiv(g.R, tr), triton.cdiv(g.C, tc)
    grid = (B0 * B1 * B2 * tiles_r * tiles_c,)
    tiled_kernel[grid](
        x, y, g.R, g.C, g.in_sr, g.out_sc, tiles_r, tiles_c,
        B1, B2, ib0, ib1, ib2, ob0, ob1, ob2,
        TILE_R=tr, TILE_C=tc, INT64=needs_int64(p, tr * tc), num_warps=config.get("num_warps", 4),
    )


def launch_gather(x, y, p: Plan, config: dict) -> None:
    if p.numel == 0:
        return
    C, in_sc = p.dims[-1]
    rows = p.numel // C
    row_dims = list(reversed(p.dims[:-1])) or [(1, 0)]  # innermost first
    inner, (_, t_last) = row_dims[:-1], row_dims[-1]
    sizes = [s for s, _ in inner] + [1] * (4 - len(inner))
    strides = [st for _, st in inner] + [0] * (4 - len(inner))
    br, bc = config.get("BLOCK_R", 1), config.get("BLOCK_C", 1024)
    tiles_c = triton.cdiv(C, bc)
    grid = (triton.cdiv(rows, br) * tiles_c,)
    gather_kernel[grid](
        x, y, rows, C, in_sc, tiles_c, *sizes, *strides, t_last,
        NROW=len(row_dims), UNIT_C=in_sc == 1, BLOCK_R=br, BLOCK_C=bc,
        INT64=needs_int64(p, br * bc), num_warps=config.get("num_warps", 4),
    )

"""Scan ops: ``cumsum``, ``cumprod``, ``cummax``, ``cummin`` and
``segmented_cumsum`` (``compact`` and ``nonzero``, which run the scans'
look-back kernel, are in ``ops.compact``).

Torch semantics. ``cumsum``/``cumprod`` promote integer and bool inputs to
int64 unless ``dtype`` is given (the input is then cast to ``dtype`` first, as
torch does); floats keep their dtype, with fp32 arithmetic for 16-bit floats
and fp64 for fp64. ``exclusive`` shifts the scan by one (position 0 is the
identity), ``reverse`` scans from the end. ``cummax``/``cummin`` return
``(values, indices)`` like torch: ties take the last index; a NaN propagates
and each later NaN moves the index to itself. Any leading shape, any dim
(negative too), non-contiguous inputs, empty tensors and 0-dim tensors.

Layout. A scan over the innermost (unit-stride) dim runs on the ``[rows,
cols]`` view (``rows_view``: a view when the layout allows, else a copy) and
writes a dense output with ``dim`` innermost (``empty_moved``). A scan over
another dim of a contiguous tensor runs in place on ``[outer, L, inner]``
(``triton_columns``), output contiguous (a few long columns instead take a
transposing copy and the tile scans: one program per column would idle the
GPU). Variants of ``cumsum``/``cumprod``,
in dispatch order: ``triton_lookback`` (single-pass decoupled look-back over
tiles; rows of at least ``TILE_MIN_COLS``), ``triton_reduce_scan`` (the
3-phase reduce-then-scan, same rows), ``triton_columns``, ``triton_row`` (one
program walks a row, several short rows a program), ``torch_eager`` (CUDA) and
``reference``.

``segmented_cumsum(x, flags=|offsets=)`` restarts the sum at each segment
start (``flags``: bool, same shape; ``offsets``: CSR starts like
``cu_seqlens``, turned into flags on the device; non-decreasing within
``[0, n]``, checked by one device reduction and host sync). A 2-D input is
scanned along its last dim, each row starting a segment.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import torch

from opforge.kernels import scan as K

from opforge.ops.checks import check_dim, check_tensor
from opforge.ops.device_gate import unmeasured
from opforge.ops.library import define, direct_ok
from opforge.runtime import dispatch, registry
from opforge.runtime.registry import Spec
from opforge.runtime.shapes import bucket_size, empty_moved, norm_dim, rows_view

FLOATS = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})
INTS = frozenset({torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64})
# Dtypes the Triton kernels take (bool goes through them as a 0/1 integer).
SCAN_DTYPES = FLOATS | INTS | {torch.bool}
MINMAX_DTYPES = FLOATS | INTS
SCANS = ("cumsum", "cumprod")
MINMAX = ("cummax", "cummin")


# ---------------------------------------------------------------------------
# Reference semantics (plain torch, float64-capable)
# ---------------------------------------------------------------------------
def out_dtype(x: torch.Tensor, dtype: torch.dtype | None) -> torch.dtype:
    """torch's rule for cumsum/cumprod: integers and bool accumulate to int64."""
    if dtype is not None:
        return dtype
    return x.dtype if x.dtype.is_floating_point else torch.int64


def _shifted(t: torch.Tensor, dim: int, ident) -> torch.Tensor:
    """``t`` shifted one step along ``dim``: position 0 gets the identity."""
    if t.shape[dim] == 0:
        return t
    head = torch.full_like(t.narrow(dim, 0, 1), ident)
    return torch.cat([head, t.narrow(dim, 0, t.shape[dim] - 1)], dim)


def _scan_ref(fn, ident, x, dim, exclusive=False, reverse=False, dtype=None):
    t = x.to(out_dtype(x, dtype))
    if t.dim() == 0:
        return (torch.full_like(t, ident) if exclusive else t).clone()
    d = norm_dim(t, dim)
    if reverse:
        t = t.flip(d)
    if exclusive:
        t = _shifted(t, d, ident)
    y = fn(t, d)
    return y.flip(d) if reverse else y


def _cumsum_ref(x, dim, exclusive=False, reverse=False, dtype=None):
    return _scan_ref(torch.cumsum, 0, x, dim, exclusive, reverse, dtype)


def _cumprod_ref(x, dim, exclusive=False, reverse=False, dtype=None):
    return _scan_ref(torch.cumprod, 1, x, dim, exclusive, reverse, dtype)


def _cummax_ref(x, dim):
    return tuple(torch.cummax(x, dim))


def _cummin_ref(x, dim):
    return tuple(torch.cummin(x, dim))


def _segment_starts(flags: torch.Tensor, reverse: bool) -> torch.Tensor:
    """Bool starts in scan order, on the flattened ``[rows, cols]`` data (each row starts one)."""
    f = flags.reshape(-1, flags.shape[-1]) if flags.dim() else flags.reshape(1, 1)
    if reverse:  # scanning from the end: a segment starts at the element before a start
        f = torch.cat([f[:, 1:], torch.ones_like(f[:, :1])], 1).flip(1)
    f = f.clone()
    if f.shape[1]:
        f[:, 0] = True
    return f.reshape(-1)


def _segmented_ref(x, flags, exclusive=False, reverse=False):
    """Computed in float64 (int64 for integers) and rounded once to the output dtype."""
    t = x.to(torch.float64 if x.is_floating_point() else torch.int64)
    shape = t.shape
    if t.numel() == 0:
        return t.clone()
    cols = shape[-1] if t.dim() else 1
    v = t.reshape(-1, cols)
    if reverse:
        v = v.flip(1)
    v = v.reshape(-1)
    starts = _segment_starts(flags, reverse)
    if exclusive:
        v = torch.where(starts, torch.zeros_like(v), torch.cat([v[:1], v[:-1]]))
    finite = bool(torch.isfinite(v).all()) if v.is_floating_point() else True
    if finite:
        c = torch.cumsum(v, 0)
        base = c - v
        pos = torch.where(starts, torch.arange(v.numel(), device=v.device), 0)
        y = c - base.gather(0, torch.cummax(pos, 0).values)
    else:  # inf - inf must not leak across segments: scan each segment alone
        bounds = torch.nonzero(starts).flatten().tolist() + [v.numel()]
        y = torch.cat([v[a:b].cumsum(0) for a, b in zip(bounds[:-1], bounds[1:])])
    y = y.reshape(-1, cols)
    if reverse:
        y = y.flip(1)
    return y.reshape(shape).to(out_dtype(x, None))


def _segmented_eager(x, flags, exclusive=False, reverse=False):
    """torch's way (the bench peer): one cumsum, minus the prefix at each segment start
    (in fp32 for 16-bit floats: their cumsum would lose the small sums)."""
    t = x.to(out_dtype(x, None))
    if t.dtype in (torch.float16, torch.bfloat16):
        return _segmented_eager(x.float(), flags, exclusive, reverse).to(t.dtype)
    if t.numel() == 0:
        return t.clone()
    cols = t.shape[-1] if t.dim() else 1
    v = t.reshape(-1, cols)
    if reverse:
        v = v.flip(1)
    v = v.reshape(-1)
    starts = _segment_starts(flags, reverse)
    if exclusive:
        v = torch.where(starts, torch.zeros_like(v), torch.cat([v[:1], v[:-1]]))
    c = torch.cumsum(v, 0)
    pos = torch.where(starts, torch.arange(v.numel(), device=v.device), 0)
    y = c - (c - v).gather(0, torch.cummax(pos, 0).values)
    y = y.reshape(-1, cols)
    return (y.flip(1) if reverse else y).reshape(t.shape)


REFERENCE = {
    "cumsum": _cumsum_ref, "cumprod": _cumprod_ref, "cummax": _cummax_ref, "cummin": _cummin_ref,
    "segmented_cumsum": _segmented_ref,
}


def _wide_eager(ref):
    """torch's scan computed in fp32 for 16-bit floats and rounded once: torch's
    own bf16 cumsum / cumprod on CUDA lose the small terms (selftest on the H200:
    rel err 2e-2 for a bf16 cumsum of 40,000, 0.78 for an fp16 cumprod of 130,
    where the Triton scans, accumulating in fp32, stay within the dtype's bound)."""
    def run(x, dim, exclusive=False, reverse=False, dtype=None):
        out = out_dtype(x, dtype)
        if out in (torch.float16, torch.bfloat16):
            return ref(x, dim, exclusive, reverse, torch.float32).to(out)
        return ref(x, dim, exclusive, reverse, dtype)
    return run


EAGER = dict(REFERENCE, cumsum=_wide_eager(_cumsum_ref), cumprod=_wide_eager(_cumprod_ref),
             segmented_cumsum=_segmented_eager)


# ---------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------
def _check_flag(where, name, value):
    if not isinstance(value, bool):
        raise TypeError(f"{where}: {name} must be a bool, got {type(value).__name__}")


def _check_dtype_arg(where, dtype):
    if dtype is None:
        return
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"{where}: dtype must be a torch.dtype or None, got {type(dtype).__name__}")
    if dtype.is_complex or dtype not in SCAN_DTYPES:
        raise TypeError(f"{where}: dtype {dtype} is not supported (expected a real float, integer or bool dtype)")


def validate_scan(name, x, dim, exclusive=False, reverse=False, dtype=None):
    where = f"opforge.{name}"
    check_tensor(where, "input", x, floating=False)
    check_dim(where, x, dim)
    _check_dtype_arg(where, dtype)
    _check_flag(where, "exclusive", exclusive)
    _check_flag(where, "reverse", reverse)


def validate_minmax(name, x, dim):
    where = f"opforge.{name}"
    check_tensor(where, "input", x, floating=False)
    check_dim(where, x, dim)


def validate_segmented(x, flags, exclusive=False, reverse=False):
    where = "opforge.segmented_cumsum"
    check_tensor(where, "input", x, floating=False)
    if x.dim() not in (1, 2):
        raise ValueError(f"{where}: input must be 1-D or 2-D (segments along the last dim), got {x.dim()} dims")
    if not isinstance(flags, torch.Tensor):
        raise TypeError(f"{where}: flags must be a torch.Tensor, got {type(flags).__name__}")
    if flags.dtype != torch.bool:
        raise TypeError(f"{where}: flags must be a bool tensor, got {flags.dtype}")
    if flags.shape != x.shape:
        raise ValueError(f"{where}: flags has shape {tuple(flags.shape)} but input has {tuple(x.shape)}")
    if flags.device != x.device:
        raise ValueError(f"{where}: flags is on {flags.device} but input is on {x.device}")
    _check_flag(where, "exclusive", exclusive)
    _check_flag(where, "reverse", reverse)


# ---------------------------------------------------------------------------
# Geometry helpers
# ---------------------------------------------------------------------------
def _geometry(t: torch.Tensor, dim: int) -> tuple[int, int]:
    cols = t.shape[norm_dim(t, dim)] if t.dim() else 1
    return (t.numel() // cols if cols else 0), cols


def _innermost(t: torch.Tensor, dim: int) -> bool:
    """The scanned dim is the unit-stride one (or all other dims are trivial)."""
    if t.dim() <= 1:
        return True
    d = norm_dim(t, dim)
    return t.stride(d) == 1 or t.shape[d] <= 1 or t.numel() == t.shape[d]


def _few_long_columns(t: torch.Tensor, dim: int) -> bool:
    """A non-innermost dim with at most 16 columns beside it and long enough for the tile
    scans: a transposing copy then the look-back beats one program per few columns."""
    outer, L, inner = _three(t, dim)
    return not _innermost(t, dim) and outer * inner <= 16 and L >= K.TILE_MIN_COLS


def _three(t: torch.Tensor, dim: int) -> tuple[int, int, int]:
    d = norm_dim(t, dim)
    outer = 1
    for s in t.shape[:d]:
        outer *= s
    inner = 1
    for s in t.shape[d + 1:]:
        inner *= s
    return outer, t.shape[d], inner


def _columns_layout(t: torch.Tensor, dim: int) -> bool:
    """Outputs are contiguous when a contiguous input is scanned over a non-innermost
    dim (the in-place column scan), else dense with ``dim`` innermost."""
    return t.dim() > 1 and t.is_contiguous() and not _innermost(t, dim)


def alloc_out(x: torch.Tensor, dim: int, dtype: torch.dtype) -> torch.Tensor:
    """The output every variant (and the fake) returns for ``x``: same layout rule for all."""
    if _columns_layout(x, dim):
        return torch.empty(x.shape, dtype=dtype, device=x.device)
    return empty_moved(x, dim, dtype)


def _via_rows(x: torch.Tensor, dim: int, dtypes, launch):
    """Run a row kernel on ``[rows, cols]`` views into dense moved buffers, then give them
    ``alloc_out``'s layout (a copy only for a forced row kernel over a column layout)."""
    bufs = [empty_moved(x, dim, dt) for dt in dtypes]
    if x.numel():
        launch(rows_view(x, dim), *[rows_view(b, dim) for b in bufs])
    if _columns_layout(x, dim):
        bufs = [b.contiguous() for b in bufs]
    return bufs


# ---------------------------------------------------------------------------
# Geometry: the shape facts every variant decides and runs on
# ---------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Geometry:
    """One call's shape facts, from what the memo key holds: ``kop`` the
    kernels' combine op; the scanned tensor as ``[rows, cols]`` and as
    ``three`` = ``[outer, L, inner]``; ``innermost``: the dim is the
    unit-stride one; ``few_long``: a few long non-innermost columns (the
    tile scans take a transposed copy); ``columns``: outputs are contiguous
    (``alloc_out``'s rule); ``dtype``: the input's."""

    kop: int
    dim: int
    rows: int
    cols: int
    three: tuple[int, int, int]
    innermost: bool
    contiguous: bool
    few_long: bool
    columns: bool
    dtype: torch.dtype


_KOP = {"cumsum": K.SUM, "cumprod": K.PROD, "cummax": K.MAX, "cummin": K.MIN, "segmented_cumsum": K.SUM}


def geometry(name: str):
    """The geometry function of op ``name``: over ``(x, dim, ...)``, or the
    last dim of a 1-D / 2-D input for ``segmented_cumsum``."""
    return functools.partial(_segmented_geometry if name == "segmented_cumsum" else _geometry_of, _KOP[name])


def _geometry_of(kop: int, x: torch.Tensor, dim: int, *rest) -> Geometry:
    rows, cols = _geometry(x, dim)
    innermost = _innermost(x, dim)
    return Geometry(kop, dim, rows, cols, _three(x, dim) if x.dim() else (1, 1, 1), innermost, x.is_contiguous(),
                    not innermost and _few_long_columns(x, dim), _columns_layout(x, dim), x.dtype)


def _segmented_geometry(kop: int, x: torch.Tensor, *rest) -> Geometry:
    if not x.dim():
        return Geometry(kop, -1, 1, 1, (1, 1, 1), True, True, False, False, x.dtype)
    return _geometry_of(kop, x, -1)


def bucket(g: Geometry) -> str:
    return f"{bucket_size(g.rows)}x{bucket_size(g.cols)}:{'c' if g.innermost else 't'}"


def row_configs(g: Geometry):
    return K.row_configs(g.rows, g.cols)


def row_default(g: Geometry):
    return K.row_default_config(g.rows, g.cols)


def tile_configs(g: Geometry):
    base = K.tile_configs(g.rows, g.cols)
    return base if unmeasured("LATE") else base + [dict(c, LATE=1) for c in base]


def tile_default(g: Geometry):
    """LATE (the LATE look-back kernel) once measured on the device: tiles of
    4096 with 2 warps, the fastest at fp32 2^28 on the H200 (657 us, 77 % of
    copy, 1.30x eager; 2026-12-02, rows_scan.py)."""
    if unmeasured("LATE"):
        return K.tile_default_config(g.rows, g.cols)
    return K.tile_late_default_config(g.rows, g.cols)


def col_configs(g: Geometry):
    return K.col_configs(*g.three)


def col_default(g: Geometry):
    return K.col_default_config(*g.three)


# ---------------------------------------------------------------------------
# Variants: cumsum / cumprod
# ---------------------------------------------------------------------------
def _scan_args(x, dim, exclusive=False, reverse=False, dtype=None):
    return exclusive, reverse, out_dtype(x, dtype)


def lookback_rows(xv, yv, kop, exclusive, reverse, cfg):
    K.launch_lookback_scan(xv, yv, None, kop, exclusive, reverse, cfg)


def reduce_then_scan_rows(xv, yv, kop, exclusive, reverse, cfg):
    K.launch_reduce_then_scan(xv, yv, kop, exclusive, reverse, cfg)


def row_scan_rows(xv, yv, kop, exclusive, reverse, cfg):
    K.launch_row_scan(xv, yv, None, kop, exclusive, reverse, cfg)


@dataclass(frozen=True)
class Scan:
    """A row kernel ``launch(xv, yv, kop, exclusive, reverse, cfg)`` over ``[rows, cols]`` views."""

    launch: Callable

    def __call__(self, g: Geometry, cfg, x, *rest):
        exclusive, reverse, dt = _scan_args(x, *rest)
        return _via_rows(x, g.dim, (dt,), lambda xv, yv: self.launch(xv, yv, g.kop, exclusive, reverse, cfg))[0]


def scan_columns_run(g: Geometry, cfg, x, *rest):
    exclusive, reverse, dt = _scan_args(x, *rest)
    y = torch.empty(x.shape, dtype=dt, device=x.device)
    K.launch_col_scan(x, y, None, *g.three, g.kop, exclusive, reverse, cfg)
    return y


def tile_check(g: Geometry) -> str | None:
    if not g.innermost and not g.few_long:
        return "dim is not the unit-stride dim (triton_columns scans it in place)"
    if g.cols < K.TILE_MIN_COLS:
        return f"rows of {g.cols} < {K.TILE_MIN_COLS} elements: one program per row is enough"
    return None


# one program walks each row serially: past this many elements with fewer rows than ``ROW_KERNEL_MIN_ROWS``
# the tile scans (all SMs) take the row, whatever a nearest-bucket entry of the row kernel says (issue 24:
# the 1x16384 int64 entry stood in for 60M-element offsets in TPC-H q21's join, 4.5 -> 160 ms)
ROW_KERNEL_MAX_COLS = 4 * K.TILE_MIN_COLS
ROW_KERNEL_MIN_ROWS = 32


def row_check(g: Geometry) -> str | None:
    if tile_check(g) is None and g.cols > ROW_KERNEL_MAX_COLS and g.rows < ROW_KERNEL_MIN_ROWS:
        return (f"{g.rows} row(s) of {g.cols} elements: one program a row would walk it serially "
                "(the tile scans take it)")
    return None


def scan_columns_check(g: Geometry) -> str | None:
    if g.innermost:
        return "dim is the unit-stride dim (the row kernels take it)"
    if not g.contiguous:
        return "input is not contiguous (the row kernel takes a copy)"
    if g.few_long:
        return "a few long columns: too few programs (the tile scans take a transposed copy)"
    return None


def _name(g: Geometry) -> str:
    return {K.SUM: "cumsum", K.PROD: "cumprod", K.MAX: "cummax", K.MIN: "cummin"}[g.kop]


def scan_eager_run(g: Geometry, cfg, *args):
    return EAGER[_name(g)](*args)


def scan_reference_run(g: Geometry, cfg, x, dim, exclusive=False, reverse=False, dtype=None):
    return alloc_out(x, dim, out_dtype(x, dtype)).copy_(REFERENCE[_name(g)](x, dim, exclusive, reverse, dtype))


def scan_specs(name: str) -> list[Spec]:
    return [
        Spec("triton_lookback", Scan(lookback_rows), version=K.LOOKBACK_VERSION, dtypes=SCAN_DTYPES,
             check=tile_check, configs=tile_configs, default_config=tile_default, bucket=bucket,
             description="single-pass chained scan with decoupled look-back over tiles (one read, "
                         f"one write); rows >= {K.TILE_MIN_COLS}"),
        Spec("triton_reduce_scan", Scan(reduce_then_scan_rows), version=K.REDUCE_SCAN_VERSION, dtypes=SCAN_DTYPES,
             check=tile_check, configs=tile_configs, default_config=tile_default, bucket=bucket,
             description="reduce-then-scan: tile totals, their scan, then tile scans (two reads)"),
        Spec("triton_columns", scan_columns_run, version=K.COL_VERSION, dtypes=SCAN_DTYPES,
             check=scan_columns_check, configs=col_configs, default_config=col_default, bucket=bucket,
             description="scan down a non-innermost dim of a contiguous tensor, column tiles per program"),
        Spec("triton_row", Scan(row_scan_rows), version=K.ROW_VERSION, dtypes=SCAN_DTYPES,
             check=row_check, configs=row_configs, default_config=row_default, bucket=bucket,
             description="one program walks a row in blocks with a carried prefix; any row length"),
        Spec("torch_eager", scan_eager_run, kind="vendor", devices=("cuda",), dtypes=SCAN_DTYPES, bucket=bucket,
             description=f"torch.{name}"),
        Spec("reference", scan_reference_run, kind="reference", devices=("cpu", "cuda"),
             description="plain torch (the oracle and the CPU fallback)"),
    ]


# ---------------------------------------------------------------------------
# Variants: cummax / cummin
# ---------------------------------------------------------------------------
def minmax_row_run(g: Geometry, cfg, x, dim):
    def launch(xv, yv, iv):
        if x.dtype in INTS and g.rows < ROW_KERNEL_MIN_ROWS and g.cols > ROW_KERNEL_MAX_COLS:
            _tiled_minmax(xv, yv, iv, g.kop)
        else:
            K.launch_row_scan(xv, yv, iv, g.kop, False, False, cfg)
    return _via_rows(x, dim, (x.dtype, torch.int64), launch)


MINMAX_TILE = 4096


def _tiled_minmax(x, y, idx, kop: int) -> None:
    """A few long integer rows in two levels, so all SMs share them (one program a row took
    2.8 ms for 2^20 int64 on the H200, as torch.cummax did): each tile of ``MINMAX_TILE`` scanned
    alone, the tiles' last pairs scanned across tiles, and each tile raised by the carry of the
    tiles before it. Ties keep the later index (torch's rule): a tile's own pair wins a tie with
    the carry. Integers only: no NaN to order."""
    rows, cols = x.shape
    c = MINMAX_TILE
    t = -(-cols // c)
    info = torch.iinfo(x.dtype)
    fill = info.min if kop == K.MAX else info.max
    xp = torch.full((rows, t * c), fill, dtype=x.dtype, device=x.device)
    xp[:, :cols] = x
    tv = torch.empty_like(xp)
    ti = torch.empty(xp.shape, dtype=torch.int64, device=x.device)
    tiles = (rows * t, c)
    K.launch_row_scan(xp.view(tiles), tv.view(tiles), ti.view(tiles), kop, False, False,
                      K.row_default_config(*tiles))
    tv, ti = tv.view(rows, t, c), ti.view(rows, t, c)
    ti += torch.arange(0, t * c, c, device=x.device).view(1, t, 1)
    cv, ci = torch.empty((rows, t), dtype=x.dtype, device=x.device), torch.empty((rows, t), dtype=torch.int64,
                                                                                   device=x.device)
    last_v, last_i = tv[:, :, -1].contiguous(), ti[:, :, -1].contiguous()
    K.launch_row_scan(last_v, cv, ci, kop, False, False, K.row_default_config(rows, t))
    ci = last_i.gather(1, ci)  # the winning tile's element index
    # the carry into tile k: the scan over tiles 0..k-1 (none before the first tile)
    carry_v = torch.cat([cv.new_full((rows, 1), fill), cv[:, :-1]], 1).unsqueeze(2)
    carry_i = torch.cat([ci.new_full((rows, 1), 0), ci[:, :-1]], 1).unsqueeze(2)
    take = tv < carry_v if kop == K.MAX else tv > carry_v
    y.copy_(torch.where(take, carry_v, tv).view(rows, t * c)[:, :cols])
    idx.copy_(torch.where(take, carry_i, ti).view(rows, t * c)[:, :cols])


def minmax_columns_run(g: Geometry, cfg, x, dim):
    y = torch.empty_like(x, memory_format=torch.contiguous_format)
    i = torch.empty(x.shape, dtype=torch.int64, device=x.device)
    K.launch_col_scan(x, y, i, *g.three, g.kop, False, False, cfg)
    return y, i


def minmax_columns_check(g: Geometry) -> str | None:
    if g.innermost:
        return "dim is the unit-stride dim (the row kernel takes it)"
    if not g.contiguous:
        return "input is not contiguous (the row kernel takes a copy)"
    return None


def minmax_eager_run(g: Geometry, cfg, x, dim):
    return REFERENCE[_name(g)](x, dim)


def minmax_reference_run(g: Geometry, cfg, x, dim):
    y, i = alloc_out(x, dim, x.dtype), alloc_out(x, dim, torch.int64)
    vy, vi = REFERENCE[_name(g)](x, dim)
    return y.copy_(vy), i.copy_(vi)


def minmax_specs(name: str) -> list[Spec]:
    return [
        Spec("triton_columns", minmax_columns_run, version=K.COL_VERSION, dtypes=MINMAX_DTYPES,
             check=minmax_columns_check, configs=col_configs, default_config=col_default, bucket=bucket,
             description="(value, index) scan down a non-innermost dim, column tiles"),
        Spec("triton_row", minmax_row_run, version=K.ROW_VERSION, dtypes=MINMAX_DTYPES,
             configs=row_configs, default_config=row_default, bucket=bucket,
             description="(value, index) scan of rows in blocks with a carried pair"),
        Spec("torch_eager", minmax_eager_run, kind="vendor", devices=("cuda",), dtypes=MINMAX_DTYPES,
             bucket=bucket, description=f"torch.{name}"),
        Spec("reference", minmax_reference_run, kind="reference", devices=("cpu", "cuda"),
             description="plain torch (the oracle and the CPU fallback)"),
    ]


# ---------------------------------------------------------------------------
# Variants: segmented_cumsum
# ---------------------------------------------------------------------------
def _as_rows(t):
    return t.reshape(1, -1) if t.dim() == 1 else t


def segmented_run(g: Geometry, cfg, x, flags, exclusive=False, reverse=False):
    y = torch.empty(x.shape, dtype=out_dtype(x, None), device=x.device)
    if y.numel():
        f = flags.contiguous()
        f = f.view(torch.uint8) if f.dtype == torch.bool else f  # bytes, as the kernel reads them
        K.launch_lookback_scan(_as_rows(x.contiguous()), _as_rows(y), _as_rows(f), K.SUM, exclusive, reverse, cfg)
    return y


def segmented_check(g: Geometry) -> str | None:
    return None if g.dtype in SCAN_DTYPES else f"dtype {g.dtype} not supported"


def segmented_eager_run(g: Geometry, cfg, *args):
    return _segmented_eager(*args)


def segmented_reference_run(g: Geometry, cfg, *args):
    return _segmented_ref(*args)


def segmented_specs(name: str) -> list[Spec]:
    return [
        Spec("triton_lookback", segmented_run, version=K.LOOKBACK_VERSION, dtypes=None, check=segmented_check,
             configs=tile_configs, default_config=tile_default, bucket=bucket,
             description="segmented (flag, value) scan with decoupled look-back; a tile holding a "
                         "segment start publishes its inclusive prefix before looking back"),
        Spec("torch_eager", segmented_eager_run, kind="vendor", devices=("cuda",), bucket=bucket,
             description="torch: one cumsum minus the prefix at each segment start"),
        Spec("reference", segmented_reference_run, kind="reference", devices=("cpu", "cuda"),
             description="plain torch (the oracle and the CPU fallback)"),
    ]


def specs(name: str) -> list[Spec]:
    """The variants of op ``name``, in dispatch order."""
    if name in SCANS:
        return scan_specs(name)
    return minmax_specs(name) if name in MINMAX else segmented_specs(name)


# ---------------------------------------------------------------------------
# Selftest inputs
# ---------------------------------------------------------------------------
def sample_inputs(name: str, device: torch.device) -> list[tuple]:
    """Random inputs reaching every variant: short rows, rows of 70000 (the tile
    scans), another dim of a contiguous tensor (columns), a transposed input,
    each float dtype and int32."""
    g = torch.Generator(device="cpu").manual_seed(sum(map(ord, name)))

    def rand(shape, dtype, scale=1.0):
        if not dtype.is_floating_point:
            return torch.randint(-3, 4, shape, generator=g).to(dtype).to(device)
        if name == "cumprod":  # products of values near 1 stay finite
            return (1 + 0.01 * torch.randn(shape, generator=g, dtype=torch.float64)).to(dtype).to(device)
        return (torch.randn(shape, generator=g, dtype=torch.float64) * scale).to(dtype).to(device)

    def bools(shape, p=0.5):
        return (torch.rand(shape, generator=g) < p).to(device)

    dts = (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int32)
    out: list[tuple] = []
    if name in SCANS:
        for dt in dts:
            out += [(rand((67, 130), dt), -1, False, False), (rand((5, 7, 33), dt), 1, True, False),
                    (rand((130, 67), dt).t(), -1, False, True), (rand((9, 1000), dt), 0, False, False)]
        out += [(rand((3, 70000), torch.float32), -1, False, False),
                (rand((200000,), torch.float32), 0, True, True),
                (rand((2, 40000), torch.bfloat16), -1, False, False),
                (rand((70000,), torch.int32), 0, False, False),
                (rand((300, 500), torch.int64), 1, False, False, torch.float64)]
    elif name in MINMAX:
        for dt in dts:
            out += [(rand((67, 130), dt), -1), (rand((5, 7, 33), dt), 1), (rand((130, 67), dt).t(), -1),
                    (rand((9, 1000), dt), 0)]
        out.append((rand((3, 70000), torch.float32), -1))
    elif name == "segmented_cumsum":
        for dt in dts:
            out += [(rand((1000,), dt), bools((1000,), 0.05), False, False),
                    (rand((4, 300), dt), bools((4, 300), 0.02), True, False),
                    (rand((777,), dt), bools((777,), 0.01), False, True)]
        out.append((rand((300000,), torch.float32), bools((300000,), 0.001), True, True))
    return out


# ---------------------------------------------------------------------------
# Registration
# ---------------------------------------------------------------------------
def _dt(dtype):
    return "" if dtype is None else f"->{dtype}".replace("torch.", "")


def _tensors(x, *rest):
    return (x,)


def _segmented_tensors(x, flags, *rest):
    return (x, flags)


def _scan_memo_key(x, dim, exclusive=False, reverse=False, dtype=None):
    return (x.dtype, x.shape, x.stride(), x.device, dim, exclusive, reverse, dtype)


def _minmax_memo_key(x, dim):
    return (x.dtype, x.shape, x.stride(), x.device, dim)


def _segmented_memo_key(x, flags, exclusive=False, reverse=False):
    return (x.dtype, x.shape, x.stride(), flags.stride(), x.device, exclusive, reverse)


def _scan_dtype_key(x, dim, exclusive=False, reverse=False, dtype=None):
    return f"{x.dtype}".replace("torch.", "") + _dt(dtype)


def _dtype_key(x, *rest):
    return f"{x.dtype}".replace("torch.", "")


def _validate(name: str):
    if name in SCANS:
        return functools.partial(validate_scan, name)
    return functools.partial(validate_minmax, name) if name in MINMAX else validate_segmented


def _doc(name: str) -> str:
    if name in SCANS:
        return f"{name} over one dim (exclusive / reverse)"
    return f"{name} over one dim: (values, indices)" if name in MINMAX else "cumsum restarting at segment starts (flags)"


OPS = registry.register_family(
    SCANS + MINMAX + ("segmented_cumsum",), specs, geometry=geometry, reference=REFERENCE.__getitem__,
    tensors=lambda name: _segmented_tensors if name == "segmented_cumsum" else _tensors,
    memo_key=lambda name: (_scan_memo_key if name in SCANS
                           else _minmax_memo_key if name in MINMAX else _segmented_memo_key),
    dtype_key=lambda name: _scan_dtype_key if name in SCANS else _dtype_key,
    validate=_validate, samples=lambda name: functools.partial(sample_inputs, name), doc=_doc,
)


def _define_scans() -> None:
    for name in SCANS:
        op = OPS[name]

        def impl(x, dim, exclusive, reverse, dtype, op=op):
            return dispatch.call(op, x, dim, exclusive, reverse, dtype)

        def fake(x, dim, exclusive, reverse, dtype, name=name):
            validate_scan(name, x, dim, exclusive, reverse, dtype)
            return alloc_out(x, dim, out_dtype(x, dtype))

        def setup(ctx, inputs, output):
            x, dim, exclusive, reverse, dtype = inputs
            ctx.dim, ctx.exclusive, ctx.reverse, ctx.in_dtype = dim, exclusive, reverse, x.dtype
            ctx.save_for_backward(x, output)

        if name == "cumsum":
            def backward(ctx, g):
                # d/dx of a scan is the scan the other way round (same exclusivity), through opforge.
                if not ctx.in_dtype.is_floating_point:
                    return None, None, None, None, None
                gx = torch.ops.opforge.cumsum(g, ctx.dim, ctx.exclusive, not ctx.reverse, None)
                return gx.to(ctx.in_dtype), None, None, None, None
        else:
            def backward(ctx, g):
                # torch's cumprod gradient (handles zeros), through the reference's autograd.
                if not ctx.in_dtype.is_floating_point:
                    return None, None, None, None, None
                x, _ = ctx.saved_tensors
                with torch.enable_grad():
                    xx = x.detach().requires_grad_()
                    y = _cumprod_ref(xx, ctx.dim, ctx.exclusive, ctx.reverse, g.dtype)
                    (gx,) = torch.autograd.grad(y, xx, g, create_graph=g.requires_grad)
                return gx.to(ctx.in_dtype), None, None, None, None

        define(f"{name}(Tensor self, int dim, bool exclusive, bool reverse, ScalarType? dtype) -> Tensor",
               impl, fake, backward, setup)


def _define_minmax() -> None:
    for name in MINMAX:
        op = OPS[name]

        def impl(x, dim, op=op):
            return dispatch.call(op, x, dim)

        def fake(x, dim, name=name):
            validate_minmax(name, x, dim)
            return alloc_out(x, dim, x.dtype), alloc_out(x, dim, torch.int64)

        def setup(ctx, inputs, output):
            x, dim = inputs
            ctx.dim, ctx.shape = dim, x.shape
            ctx.save_for_backward(output[1])
            ctx.mark_non_differentiable(output[1])

        def backward(ctx, gv, gi):
            (idx,) = ctx.saved_tensors
            if gv.dim() == 0:
                return gv.clone(), None
            gx = torch.zeros(ctx.shape, dtype=gv.dtype, device=gv.device)
            return gx.scatter_add(norm_dim(gv, ctx.dim), idx, gv), None

        define(f"{name}(Tensor self, int dim) -> (Tensor values, Tensor indices)", impl, fake, backward, setup)


def _define_segmented() -> None:
    op = OPS["segmented_cumsum"]

    def impl(x, flags, exclusive, reverse):
        return dispatch.call(op, x, flags, exclusive, reverse)

    def fake(x, flags, exclusive, reverse):
        validate_segmented(x, flags, exclusive, reverse)
        return torch.empty(x.shape, dtype=out_dtype(x, None), device=x.device)

    def setup(ctx, inputs, output):
        x, flags, exclusive, reverse = inputs
        ctx.exclusive, ctx.reverse, ctx.in_dtype = exclusive, reverse, x.dtype
        ctx.save_for_backward(flags)

    def backward(ctx, g):
        if not ctx.in_dtype.is_floating_point:
            return None, None, None, None
        (flags,) = ctx.saved_tensors
        gx = torch.ops.opforge.segmented_cumsum(g, flags, ctx.exclusive, not ctx.reverse)
        return gx.to(ctx.in_dtype), None, None, None

    define("segmented_cumsum(Tensor self, Tensor flags, bool exclusive, bool reverse) -> Tensor",
           impl, fake, backward, setup)


_define_scans()
_define_minmax()
_define_segmented()


# ---------------------------------------------------------------------------
# Public functions
# ---------------------------------------------------------------------------
_call = dispatch.call


def _scan_public(name: str):
    packet = getattr(torch.ops.opforge, name).default
    op = OPS[name]

    def fn(input: torch.Tensor, dim: int, *, dtype: torch.dtype | None = None, exclusive: bool = False,
           reverse: bool = False) -> torch.Tensor:
        if direct_ok(input) and type(dim) is int:
            return _call(op, input, dim, exclusive, reverse, dtype)
        validate_scan(name, input, dim, exclusive, reverse, dtype)
        return packet(input, dim, exclusive, reverse, dtype)

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = (f"``torch.{name}(input, dim, dtype=dtype)`` with ``exclusive`` (shift by one, identity "
                  f"first) and ``reverse`` (scan from the end); integers accumulate to int64.")
    return fn


def _minmax_public(name: str):
    packet = getattr(torch.ops.opforge, name).default
    op = OPS[name]

    def fn(input: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
        if direct_ok(input) and type(dim) is int:
            return _call(op, input, dim)
        validate_minmax(name, input, dim)
        return packet(input, dim)

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"``torch.{name}(input, dim)``: (values, indices), ties and NaN as torch."
    return fn


cumsum = _scan_public("cumsum")
cumprod = _scan_public("cumprod")
cummax = _minmax_public("cummax")
cummin = _minmax_public("cummin")


def offsets_to_flags(offsets: torch.Tensor, n: int) -> torch.Tensor:
    """CSR segment starts (``offsets[0] == 0``, ``offsets[-1] == n``) as bool start flags, on the device."""
    f = torch.zeros(n + 1, dtype=torch.bool, device=offsets.device)
    f.index_fill_(0, offsets[:-1].long().clamp(0, n), True)
    return f[:n]


def check_offsets(offsets: torch.Tensor, n: int) -> None:
    """CSR starts non-decreasing within ``[0, n]``: one reduction, one host
    sync (skipped while a CUDA graph is captured, where no sync is allowed)."""
    if offsets.is_cuda and torch.cuda.is_current_stream_capturing():
        return
    bad = (offsets < 0) | (offsets > n)
    if offsets.numel() > 1:
        bad[1:] |= offsets[1:] < offsets[:-1]
    if bool(bad.any()):
        raise ValueError(f"opforge.segmented_cumsum: offsets must be non-decreasing and within [0, {n}] (the "
                         f"input's length), got {offsets.tolist() if offsets.numel() <= 16 else 'others'}")


def segmented_cumsum(input: torch.Tensor, *, flags: torch.Tensor | None = None,
                     offsets: torch.Tensor | None = None, exclusive: bool = False,
                     reverse: bool = False) -> torch.Tensor:
    """Cumulative sum restarting at each segment. ``flags``: bool, same shape,
    True at each segment's first element; ``offsets``: int32/int64 CSR starts
    of a 1-D input. Exactly one of them. A 2-D input scans each row."""
    where = "opforge.segmented_cumsum"
    if (flags is None) == (offsets is None):
        raise ValueError(f"{where}: give exactly one of flags= and offsets=")
    if offsets is not None:
        if not isinstance(offsets, torch.Tensor):
            raise TypeError(f"{where}: offsets must be a torch.Tensor, got {type(offsets).__name__}")
        if offsets.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"{where}: offsets must be int32 or int64, got {offsets.dtype}")
        if offsets.dim() != 1 or offsets.numel() < 1:
            raise ValueError(f"{where}: offsets must be 1-D with at least one entry, got shape "
                             f"{tuple(offsets.shape)}")
        check_tensor(where, "input", input, floating=False)
        if input.dim() != 1:
            raise ValueError(f"{where}: offsets need a 1-D input, got {input.dim()} dims (use flags=)")
        offsets = offsets.to(input.device)
        check_offsets(offsets, input.shape[0])
        flags = offsets_to_flags(offsets, input.shape[0])
    if direct_ok(input, flags):
        return _call(OPS["segmented_cumsum"], input, flags, exclusive, reverse)
    validate_segmented(input, flags, exclusive, reverse)
    return torch.ops.opforge.segmented_cumsum.default(input, flags, exclusive, reverse)


__all__ = ["cumsum", "cumprod", "cummax", "cummin", "segmented_cumsum"]

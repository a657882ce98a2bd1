"""Reductions: ``sum``, ``mean``, ``amax``, ``amin``, ``max``/``min`` (with or
without ``dim``), ``argmax``, ``argmin``, ``var``, ``std`` with torch semantics.

``dim`` is None (every dim), an int, or a list/tuple of ints (negative dims,
any order; ``[]`` means every dim, as in torch); ``keepdim`` keeps reduced
dims as size 1. Dtypes as torch: fp16/bf16/fp32/fp64 everywhere; bool and
integer inputs for ``sum`` (accumulated and returned in int64; ``dtype=``
casts the input first), ``amax``/``amin``/``max``/``min`` and (not bool)
``argmax``/``argmin``; ``mean``/``var``/``std`` need a floating result.
Empty reductions: ``sum`` 0, ``mean``/``var``/``std`` NaN, the extremes raise
(no identity), as torch. NaN propagates through max/min, argmax/argmin point
at the first NaN, ties go to the first index. ``var``/``std`` take torch's
``correction`` (dof <= 0 gives inf or NaN, as torch). Outputs are contiguous,
as torch's.

Layout (``plan``): size-1 dims are dropped, the rest sorted by stride
(memory order; reductions other than arg* do not depend on the order) and
adjacent dims with the same role and mergeable strides are collapsed. Then:

* ``[kept?, reduced]`` -> ``rows`` geometry ``[O, R]`` (reduced dims innermost);
* ``[reduced, kept]`` / ``[kept, reduced, kept]`` -> ``cols`` geometry
  ``[O, R, I]``: the reduced axis is strided, the inner kept axis contiguous,
  and the kernel reads it in place (no transpose);
* anything else (interleaved reduced and kept dims that do not collapse, or a
  flattened argmax over a non-contiguous input) is permuted and copied to a
  dense ``[kept, reduced]`` first: the last resort.

The kernels get the original tensor and its strides (a view, never a copy in
the first two cases). The output is written dense in the kept dims' memory
order: for inputs whose kept dims are in logical order (every contiguous
input) that *is* the contiguous result; otherwise a small output-sized copy
reorders it.

Registry ops (``opforge::<name>``) and their arguments (canonical ``dims``: a
sorted tuple of non-negative ints, ``()`` = every dim; for arg ops ``()`` =
flattened):

* ``sum`` / ``mean``: ``(x, dims, keepdim, dtype=None)``
* ``amax`` / ``amin``: ``(x, dims, keepdim)``
* ``argmax`` / ``argmin``: ``(x, dims, keepdim, values=False)``; with
  ``values=True`` the variant returns ``(values, indices)`` from one pass (how
  ``max``/``min`` with ``dim`` run).
* ``var`` / ``std``: ``(x, dims, correction, keepdim)``

Variants, in dispatch order: ``triton_split_two_pass`` (``red`` cut into
chunks over a second grid axis, partials combined by a second, fixed-order
kernel: deterministic; only where the unsplit kernel would run too few
programs to fill the GPU), ``triton_split_atomic`` (sum/mean/amax/amin with
an fp32 result: partials folded into the output by atomics; rejected in
deterministic mode, i.e. ``torch.use_deterministic_algorithms(True)``),
``triton_rows``, ``triton_cols``, ``torch_eager`` (CUDA) and ``reference``.
Two-pass comes first: with the output's zero-fill the atomic variant needs
two launches as well, so it saves nothing by default; autotune may still
pick it, and ``bench.reduce.crossover_cases`` compares the two.

Autograd (plain torch: these are broadcasts): sum/mean broadcast the
gradient; amax/amin split it evenly among ties; max/min with ``dim`` route
it to the index; var/std use torch's formulas; argmax/argmin are not
differentiable.
"""

from __future__ import annotations

import builtins
import functools
import math
from dataclasses import dataclass
from typing import NamedTuple

import torch

from opforge.kernels import reduce as K
from opforge.ops.checks import check_tensor
from opforge.ops.library import define, direct_ok
from opforge.runtime import dispatch, registry
from opforge.runtime.registry import Spec
from opforge.runtime.shapes import bucket_size

# This module defines sum/max/min; keep the builtins at hand.
_bsum, _bmax, _bmin = builtins.sum, builtins.max, builtins.min

FLOATS = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})
INTS = frozenset({torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64})
ALL = FLOATS | INTS | {torch.bool}
NAMES = ("sum", "mean", "amax", "amin", "argmax", "argmin", "var", "std")
INPUT_DTYPES = {
    "sum": ALL, "mean": ALL, "amax": ALL, "amin": ALL,
    "argmax": FLOATS | INTS, "argmin": FLOATS | INTS, "var": FLOATS, "std": FLOATS,
}
EXTREMES = ("amax", "amin", "argmax", "argmin")
MOMENTS = ("var", "std")
_WHAT = {"amax": "max", "amin": "min", "argmax": "argmax", "argmin": "argmin"}


# ---------------------------------------------------------------------------
# Reference semantics (plain torch, float64-capable)
# ---------------------------------------------------------------------------
def _all_if_empty(x, dims):
    return tuple(range(x.dim())) if not dims else tuple(dims)


def _sum_ref(x, dims=(), keepdim=False, dtype=None):
    return torch.sum(x, _all_if_empty(x, dims), keepdim=keepdim, dtype=dtype)


def _mean_ref(x, dims=(), keepdim=False, dtype=None):
    return torch.mean(x, _all_if_empty(x, dims), keepdim=keepdim, dtype=dtype)


def _amax_ref(x, dims=(), keepdim=False):
    return torch.amax(x, _all_if_empty(x, dims), keepdim=keepdim)


def _amin_ref(x, dims=(), keepdim=False):
    return torch.amin(x, _all_if_empty(x, dims), keepdim=keepdim)


def _arg_ref(fn, values_fn):
    def ref(x, dims=(), keepdim=False, values=False):
        d = dims[0] if dims else None
        i = fn(x, d, keepdim=keepdim)
        if not values:
            return i
        return values_fn(x, d, keepdim=keepdim).values, i
    return ref


def _var_ref(x, dims=(), correction=1.0, keepdim=False):
    return torch.var(x, _all_if_empty(x, dims), correction=correction, keepdim=keepdim)


def _std_ref(x, dims=(), correction=1.0, keepdim=False):
    return torch.std(x, _all_if_empty(x, dims), correction=correction, keepdim=keepdim)


REFERENCE = {
    "sum": _sum_ref, "mean": _mean_ref, "amax": _amax_ref, "amin": _amin_ref,
    "argmax": _arg_ref(torch.argmax, torch.max), "argmin": _arg_ref(torch.argmin, torch.min),
    "var": _var_ref, "std": _std_ref,
}


# ---------------------------------------------------------------------------
# Arguments: canonical dims, validation, result dtype
# ---------------------------------------------------------------------------
def canon_dims(name: str, x, dim, *, single: bool = False) -> tuple:
    """``dim`` as a sorted tuple of non-negative ints (``()``: every dim), or a clear error."""
    where = f"opforge.{name}"
    if dim is None:
        return ()
    if isinstance(dim, bool) or not isinstance(dim, (int, list, tuple)):
        what = "an int or None" if single else "an int, a tuple of ints or None"
        raise TypeError(f"{where}: dim must be {what}, got {type(dim).__name__}")
    if single and not isinstance(dim, int):
        raise TypeError(f"{where}: dim must be an int or None, got {type(dim).__name__}")
    items = (dim,) if isinstance(dim, int) else tuple(dim)
    n = _bmax(x.dim(), 1)
    out = []
    for d in items:
        if isinstance(d, bool) or not isinstance(d, int):
            raise TypeError(f"{where}: dim must contain ints, got {type(d).__name__}")
        if not -n <= d < n:
            raise ValueError(f"{where}: dim {d} is out of range for a tensor with {x.dim()} dims "
                             f"(expected {-n} <= dim < {n})")
        d = d % n
        if d in out:
            raise ValueError(f"{where}: dim {d} appears more than once in {list(items)}")
        out.append(d)
    if x.dim() == 0:
        return ()
    return tuple(sorted(out))


def result_dtype(name: str, x: torch.Tensor, dtype=None) -> torch.dtype:
    if name == "sum":
        return dtype or (torch.int64 if x.dtype in INTS or x.dtype == torch.bool else x.dtype)
    if name == "mean":
        return dtype or x.dtype
    if name in ("argmax", "argmin"):
        return torch.int64
    return x.dtype


def validate(name: str, x, dims=(), *rest, alias: str | None = None) -> None:
    where = f"opforge.{alias or name}"
    check_tensor(where, "input", x, floating=False)
    if not isinstance(dims, tuple) or any(isinstance(d, bool) or not isinstance(d, int) for d in dims):
        raise TypeError(f"{where}: dims must be a tuple of ints, got {dims!r}")
    canon_dims(alias or name, x, list(dims))
    if name in ("sum", "mean", "amax", "amin"):
        keepdim = rest[0] if rest else False
    elif name in MOMENTS:
        keepdim = rest[1] if len(rest) > 1 else False
        correction = rest[0] if rest else 1.0
        if isinstance(correction, bool) or not isinstance(correction, (int, float)):
            raise TypeError(f"{where}: correction must be a number, got {type(correction).__name__}")
    else:
        keepdim = rest[0] if rest else False
        if len(dims) > 1:
            raise ValueError(f"{where}: dim must be a single dim or None, got {list(dims)}")
    if not isinstance(keepdim, bool):
        raise TypeError(f"{where}: keepdim must be a bool, got {type(keepdim).__name__}")
    dtype = rest[1] if name in ("sum", "mean") and len(rest) > 1 else None
    if dtype is not None and (not isinstance(dtype, torch.dtype) or dtype not in ALL):
        raise TypeError(f"{where}: dtype must be a real torch.dtype or None, got {dtype!r}")
    if x.dtype not in INPUT_DTYPES[name] and (name != "mean" or dtype is None):
        if name in ("argmax", "argmin") and x.dtype == torch.bool:
            raise TypeError(f"{where}: bool input is not supported (as in torch)")
        raise TypeError(f"{where}: input must be a floating-point tensor, got {x.dtype}")
    what = alias or _WHAT.get(name, name)
    if name == "mean" and not result_dtype(name, x, dtype).is_floating_point:
        raise TypeError(f"{where}: could not infer a floating output dtype from input {x.dtype}; "
                        f"pass a floating dtype=")
    if name in EXTREMES and x.numel() == 0:
        if not dims and x.dim() != 0:
            raise ValueError(f"{where}: cannot reduce an empty tensor over every dim "
                             f"(no identity for {what}); specify dim")
        zero = [d for d in dims if x.shape[d] == 0]
        if zero:
            raise ValueError(f"{where}: cannot reduce over dim {zero[0]} of size 0 "
                             f"(no identity for {what})")


def out_shape(x: torch.Tensor, dims: tuple, keepdim: bool) -> list[int]:
    red = set(dims) if dims else set(range(x.dim()))
    if keepdim:
        return [1 if d in red else s for d, s in enumerate(x.shape)]
    return [s for d, s in enumerate(x.shape) if d not in red]


# ---------------------------------------------------------------------------
# Layout plan
# ---------------------------------------------------------------------------
class Plan(NamedTuple):
    geom: tuple  # (O, R, I, so, sr, si) on the (possibly copied) input
    copy_perm: tuple | None  # permute + contiguous the input first (last resort)
    direct: bool  # the dense [O, I] output is the contiguous result
    kept_order: tuple  # kept (logical) dims in the kernel's output order


@functools.lru_cache(maxsize=4096)
def plan(shape: tuple, strides: tuple, dims: tuple, ordered: bool) -> Plan:
    """How the kernels see ``x``. ``ordered``: the reduction depends on the
    logical order of the reduced elements (a flattened argmax)."""
    nd = len(shape)
    red = set(dims) if dims else set(range(nd))
    kept = tuple(d for d in range(nd) if d not in red)
    live = [d for d in range(nd) if shape[d] != 1]
    # Memory order; Python's sort is stable, so equal strides keep logical order.
    live.sort(key=lambda d: -strides[d])
    groups: list[list] = []  # [size, stride, reduced, dims]
    for d in reversed(live):  # innermost first, so a group's stride is its innermost dim's
        r = d in red
        if groups and groups[-1][2] == r and strides[d] == groups[-1][1] * groups[-1][0]:
            groups[-1][0] *= shape[d]
            groups[-1][3].insert(0, d)
        else:
            groups.append([shape[d], strides[d], r, [d]])
    groups.reverse()
    flags = [g[2] for g in groups]
    live_red = [d for d in live if d in red]
    if ordered and len(live_red) > 1 and (len(groups) != 1 or live_red != sorted(live_red)):
        flags = None  # flattened order differs from memory order
    geom = None
    if flags is not None:
        if flags == []:
            geom = (1, 1, 1, 0, 0, 0)
        elif flags == [True]:
            geom = (1, groups[0][0], 1, 0, groups[0][1], 0)
        elif flags == [False]:
            geom = (groups[0][0], 1, 1, groups[0][1], 0, 0)
        elif flags == [False, True]:
            geom = (groups[0][0], groups[1][0], 1, groups[0][1], groups[1][1], 0)
        elif flags == [True, False]:
            geom = (1, groups[0][0], groups[1][0], 0, groups[0][1], groups[1][1])
        elif flags == [False, True, False]:
            geom = (groups[0][0], groups[1][0], groups[2][0], groups[0][1], groups[1][1], groups[2][1])
    if geom is None:
        O = math.prod(shape[d] for d in kept)
        R = math.prod(shape[d] for d in red)
        return Plan((O, R, 1, R, 1, 0), kept + tuple(sorted(red)), True, kept)
    order = tuple(d for g in groups if not g[2] for d in g[3])
    live_kept = [d for d in kept if shape[d] != 1]
    return Plan(geom, None, list(order) == live_kept, order)


def plan_of(x: torch.Tensor, dims: tuple, name: str) -> Plan:
    return plan(tuple(x.shape), tuple(x.stride()), dims, name in ("argmax", "argmin") and not dims)


def _extra(name, rest):
    """(keepdim, dtype, correction, values) from a registry op's trailing args."""
    if name in ("sum", "mean"):
        return rest[0] if rest else False, rest[1] if len(rest) > 1 else None, 1.0, True
    if name in MOMENTS:
        return rest[1] if len(rest) > 1 else False, None, float(rest[0]) if rest else 1.0, True
    if name in ("argmax", "argmin"):
        return rest[0] if rest else False, None, 1.0, bool(rest[1]) if len(rest) > 1 else False
    return rest[0] if rest else False, None, 1.0, True


_FILL = {"sum": 0, "mean": float("nan"), "var": float("nan"), "std": float("nan")}
_ATOMIC_INIT = {"sum": 0.0, "mean": 0.0, "amax": float("-inf"), "amin": float("inf")}


def run_kernel(g: Geometry, mode: int, cfg: dict, x: torch.Tensor, dims: tuple, *rest):
    """Allocate, launch on the geometry's plan; ``mode`` as ``kernels.reduce.launch``."""
    name = g.name
    keepdim, dtype, correction, want_values = _extra(name, rest)
    arg = name in ("argmax", "argmin")
    shape = out_shape(x, dims, keepdim)
    odt = g.out_dtype
    vdt = x.dtype if arg else odt
    out = torch.empty(shape, dtype=vdt, device=x.device) if (not arg or want_values) else None
    idx = torch.empty(shape, dtype=torch.int64, device=x.device) if arg else None
    if (out if out is not None else idx).numel() == 0:
        return (out, idx) if arg and want_values else (idx if arg else out)
    if x.numel() == 0:  # an empty reduction (the extremes were rejected by validate)
        return out.fill_(_FILL[name])
    p = g.plan
    src = x.permute(p.copy_perm).contiguous() if p.copy_perm is not None else x
    if src.dtype == torch.bool:
        src = src.view(torch.uint8)
    O, R, I = p.geom[:3]
    if p.direct:
        kout, kidx = out, idx
    else:  # dense in the kept dims' memory order, reordered below
        kout = torch.empty(O * I, dtype=vdt, device=x.device) if out is not None else None
        kidx = torch.empty(O * I, dtype=torch.int64, device=x.device) if idx is not None else None
    if mode == 2:
        kout.fill_(_ATOMIC_INIT[name])
    cast = dtype if (dtype is not None and name in ("sum", "mean")) else x.dtype
    K.launch(src, p.geom, _u8(kout), kidx, name, mode=mode, cfg=cfg, cast=cast, correction=correction,
             values=out is not None)
    if not p.direct:
        mem = p.kept_order  # the kernel's output order (memory order of the kept dims)
        perm = sorted(range(len(mem)), key=lambda k: mem[k])  # back to logical order
        for t, k in ((out, kout), (idx, kidx)):
            if t is not None:
                t.view([x.shape[d] for d in sorted(mem)]).copy_(k.view([x.shape[d] for d in mem]).permute(perm))
    if arg:
        return (out, idx) if want_values else idx
    return out


def _u8(t):
    return t.view(torch.uint8) if t is not None and t.dtype == torch.bool else t


# ---------------------------------------------------------------------------
# Geometry: the shape facts every variant decides and runs on
# ---------------------------------------------------------------------------
def _deterministic() -> bool:
    return torch.are_deterministic_algorithms_enabled()


@dataclass(frozen=True, slots=True)
class Geometry:
    """One call's shape facts, from what the memo key holds (dtype, shape,
    strides, the op's static arguments, deterministic mode): the layout
    ``plan``, the element size, the result dtype, and whether
    ``torch.use_deterministic_algorithms`` is on (no atomics then)."""

    name: str
    plan: Plan
    itemsize: int
    out_dtype: torch.dtype
    deterministic: bool

    @property
    def shape(self) -> tuple[int, int, int]:
        """``(O, R, I)``: outer, reduced and inner extents as the kernels see them."""
        return self.plan.geom[:3]


def geometry(name: str):
    """The geometry function of op ``name`` (its arguments: ``(x, dims, *rest)``)."""
    return functools.partial(_geometry, name)


def _geometry(name: str, x: torch.Tensor, dims: tuple, *rest) -> Geometry:
    return Geometry(name, plan_of(x, dims, name), x.element_size(), result_dtype(name, x, _extra(name, rest)[1]),
                    _deterministic())


# ---------------------------------------------------------------------------
# Variants
# ---------------------------------------------------------------------------
def direct_run(g: Geometry, cfg, x, dims, *rest):
    return run_kernel(g, 0, cfg, x, dims, *rest)


def split_run(g: Geometry, cfg, x, dims, *rest):
    return run_kernel(g, 1, cfg, x, dims, *rest)


def atomic_run(g: Geometry, cfg, x, dims, *rest):
    return run_kernel(g, 2, cfg, x, dims, *rest)


def bucket(g: Geometry) -> str:
    O, R, I = g.shape
    return f"{bucket_size(O)}x{bucket_size(R)}x{bucket_size(I)}:{'t' if g.plan.copy_perm is not None else 'v'}"


def rows_check(g: Geometry) -> str | None:
    if g.shape[2] != 1:
        return "the reduced dims are not innermost (triton_cols reads this layout)"
    return None


def cols_check(g: Geometry) -> str | None:
    if g.shape[2] == 1:
        return "the reduced dims are innermost (triton_rows reads this layout)"
    return None


def tile_default(g: Geometry):
    O, R, I = g.shape
    es = g.itemsize
    # argmax keeps an index per lane and var reduces every block: fewer lanes per thread.
    heavy = g.name in ("argmax", "argmin", "var", "std")
    if I == 1:
        return K.rows_default_config(O, R, _bmax(es, 4) if heavy else es)
    return K.cols_default_config(R, I, es, 2048 if heavy else 4096)


def tile_configs(g: Geometry):
    O, R, I = g.shape
    return K.rows_configs(O, R, g.itemsize) if I == 1 else K.cols_configs(R, I, g.itemsize)


def split_default(g: Geometry):
    cfg = tile_default(g)
    return {**cfg, "SPLIT": K.split_count(g.plan.geom, cfg)}


def split_configs(g: Geometry):
    base = tile_default(g)
    tiles = [base] + [c for c in tile_configs(g) if c != base][:5]
    out = []
    for t in tiles:
        s = K.split_count(g.plan.geom, t)
        for sp in sorted({_bmax(2, s // 2), _bmax(2, s), _bmax(2, 2 * s)}):
            out.append({**t, "SPLIT": sp})
    return out


def split_check(g: Geometry) -> str | None:
    cfg = tile_default(g)
    if K.split_count(g.plan.geom, cfg) > 1:
        return None
    p = K.programs(g.plan.geom, cfg)
    if p >= K.FILL_PROGRAMS:
        return f"the unsplit kernel runs {p} programs, enough to fill the GPU"
    return f"only {g.shape[1]} reduced elements per output: too few to split"


def atomic_check(g: Geometry) -> str | None:
    if g.deterministic:
        return "not deterministic (torch.use_deterministic_algorithms is on)"
    if g.out_dtype != torch.float32:
        return f"atomics fold into an fp32 result; this one is {g.out_dtype} (two-pass combines and casts at once)"
    return split_check(g)


def eager_run(g: Geometry, cfg, x, dims, *rest):
    return REFERENCE[g.name](x, dims, *rest)


def reference_run(g: Geometry, cfg, x, dims, *rest):
    if x.dtype in (torch.float16, torch.bfloat16) and g.name in ("sum", "mean", "var", "std"):
        # Accumulate in fp32 (torch's CPU kernels for half types may not).
        return REFERENCE[g.name](x.float(), dims, *rest).to(g.out_dtype)
    return REFERENCE[g.name](x, dims, *rest)


def specs(name: str) -> list[Spec]:
    """The variants of op ``name``, in dispatch order (``triton_split_atomic`` for sum, mean, amax, amin)."""
    dtypes = INPUT_DTYPES[name]
    atomic = [
        Spec("triton_split_atomic", atomic_run, version=K.SPLIT_VERSION, dtypes=dtypes, check=atomic_check,
             configs=split_configs, default_config=split_default, bucket=bucket,
             description="as two-pass, but partials folded into the zero/inf-filled fp32 output with "
                         "atomics: one kernel, not bitwise deterministic"),
    ] if name in K.ATOMIC_OPS else []
    return [
        Spec("triton_split_two_pass", split_run, version=K.SPLIT_VERSION, dtypes=dtypes, check=split_check,
             configs=split_configs, default_config=split_default, bucket=bucket,
             description="reduced axis cut into SPLIT chunks over a second grid axis (rows or cols "
                         "layout); partials combined by a second kernel in a fixed order: deterministic"),
        *atomic,
        Spec("triton_rows", direct_run, version=K.ROWS_VERSION, dtypes=dtypes, check=rows_check,
             configs=tile_configs, default_config=tile_default, bucket=bucket,
             description="reduced dims innermost: BLOCK_M rows per program walked in BLOCK_N blocks"),
        Spec("triton_cols", direct_run, version=K.COLS_VERSION, dtypes=dtypes, check=cols_check,
             configs=tile_configs, default_config=tile_default, bucket=bucket,
             description="reduced axis strided: BLOCK_I inner positions per program (coalesced), "
                         "walking the reduced axis in BLOCK_R rows; no transpose"),
        Spec("torch_eager", eager_run, kind="vendor", devices=("cuda",), dtypes=dtypes, bucket=bucket,
             description=f"torch.{name}"),
        Spec("reference", reference_run, kind="reference", devices=("cpu", "cuda"),
             description="plain torch (the oracle and the CPU fallback)"),
    ]


# ---------------------------------------------------------------------------
# Selftest inputs
# ---------------------------------------------------------------------------
def sample_inputs(name: str, device: torch.device) -> list[tuple]:
    """Inputs reaching every variant: short and long rows, a strided reduced
    axis (x.sum(0)), a middle dim, several dims, a transposed input (copy),
    full reductions large enough to split, ints where allowed, each float dtype."""
    g = torch.Generator(device="cpu").manual_seed(_bsum(map(ord, name)))

    def rand(shape, dtype, scale=3.0):
        if dtype in INTS or dtype == torch.bool:
            hi = 2 if dtype == torch.bool else 100
            return torch.randint(0, hi, shape, generator=g).to(dtype).to(device)
        return (torch.randn(shape, generator=g, dtype=torch.float64) * scale + 1.0).to(dtype).to(device)

    def make(x, dims, keepdim=False):
        if name in MOMENTS:
            return (x, dims, 1.0, keepdim)
        return (x, dims, keepdim)

    out = []
    floats = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
    for dt in floats:
        out += [make(rand((67, 130), dt), (1,)), make(rand((130, 67), dt), (0,)),
                make(rand((5, 7, 33), dt), (1,), True), make(rand((9, 3000), dt), (1,))]
        if name not in ("argmax", "argmin"):
            out += [make(rand((6, 5, 4), dt), (0, 2)), make(rand((40, 50), dt), ())]
        else:
            out.append(make(rand((40, 50), dt), ()))
    out += [make(rand((130, 67), torch.float32).t(), (1,)),  # strided reduced axis via rows
            make(rand((8, 70000), torch.float32), (1,)),  # few long rows: split
            make(rand((20000, 64), torch.bfloat16), (0,)),  # x.sum(0), narrow: split cols
            make(rand((1 << 20,), torch.float32), ()),  # full reduction: split
            make(rand((3, 1 << 18), torch.bfloat16), ()),
            make(rand((4, 6, 5), torch.float32).permute(2, 0, 1), (1,))]
    if name in ("sum", "amax", "amin", "argmax", "argmin"):
        for dt in (torch.int32, torch.int64, torch.uint8):
            out += [make(rand((33, 70), dt), (1,)), make(rand((70, 33), dt), (0,))]
        out.append(make(rand((4, 50000), torch.int32), (1,)))
    if name in ("sum", "amax", "amin"):
        out.append(make(rand((17, 40), torch.bool), (1,)))
    return out


# ---------------------------------------------------------------------------
# Registration: registry entry + torch.library op + autograd
# ---------------------------------------------------------------------------
def _memo_key(x, *rest):
    return (x.dtype, x.shape, x.stride(), x.device, rest, _deterministic())


def _tensors(x, *rest):
    return (x,)


def _dtype_key(x, *rest):
    return f"{x.dtype}".replace("torch.", "")


OPS = registry.register_family(
    NAMES, specs, geometry=geometry,
    reference=REFERENCE.__getitem__,
    tensors=lambda name: _tensors,
    memo_key=lambda name: _memo_key,
    dtype_key=lambda name: _dtype_key,
    validate=lambda name: functools.partial(validate, name),
    samples=lambda name: functools.partial(sample_inputs, name),
    doc=lambda name: f"{name} over any dims",
)


def _restore(g: torch.Tensor, ndim: int, dims: tuple, keepdim: bool) -> torch.Tensor:
    """``g`` (a reduction's result or gradient) with the reduced dims back as size 1."""
    if not keepdim and ndim:
        for d in (dims or range(ndim)):
            g = g.unsqueeze(d)
    return g


def _count(x, dims) -> int:
    return math.prod(x.shape[d] for d in dims) if dims else x.numel()


STAGED = ("sum", "mean", "amax", "amin")


def _staged(name: str, x: torch.Tensor, dims: tuple, keepdim: bool, dtype=None):
    """Reduce an interleaved layout in two steps instead of copying it.

    A reduction over ``[reduced, kept, reduced]`` (amax over dims (0, 2) of a
    contiguous [8, 64, N]) has no in-place geometry, and ``plan`` would permute
    and copy the whole input first. Sums, means and extremes decompose: reduce
    the innermost run of reduced dims first (a rows or cols reduction, in
    place), then the rest on that far smaller result. Sums and means carry fp32 (fp64 for fp64)
    between the steps. None where the plan needs no copy."""
    if name not in STAGED or not x.is_floating_point() or plan_of(x, dims, name).copy_perm is None:
        return None
    red = set(dims) if dims else set(range(x.dim()))
    inner = set()  # the reduced run nearest the innermost dim: a rows or cols reduction of its own
    for d in sorted((d for d in range(x.dim()) if x.shape[d] != 1), key=lambda d: x.stride(d)):
        if d in red:
            inner.add(d)
        elif inner:
            break
    if not inner or inner == red:
        return None
    if name in ("amax", "amin"):
        first = dispatch.call(OPS[name], x, tuple(sorted(inner)), True)
        return _reduce(name, first, tuple(sorted(red)), keepdim)
    acc = torch.float64 if x.dtype == torch.float64 or dtype == torch.float64 else torch.float32
    first = dispatch.call(OPS["sum"], x, tuple(sorted(inner)), True, acc)
    total = _reduce("sum", first, tuple(sorted(red)), keepdim, acc)
    if name == "mean":
        total = total / _count(x, dims)
    return total.to(result_dtype(name, x, dtype))


def _reduce(name: str, x: torch.Tensor, dims: tuple, keepdim: bool, dtype=None) -> torch.Tensor:
    """``opforge::<name>`` through dispatch, staged where that saves a copy."""
    staged = _staged(name, x, dims, keepdim, dtype)
    if staged is not None:
        return staged
    if name in ("sum", "mean"):
        return dispatch.call(OPS[name], x, dims, keepdim, dtype)
    return dispatch.call(OPS[name], x, dims, keepdim)


def _define(name: str) -> None:
    op = OPS[name]
    call = dispatch.call
    if name in ("sum", "mean"):
        schema = f"{name}(Tensor self, int[] dim, bool keepdim, ScalarType? dtype) -> Tensor"

        def impl(x, dim, keepdim, dtype):
            return _reduce(name, x, tuple(dim), keepdim, dtype)

        def fake(x, dim, keepdim, dtype):
            dims = tuple(dim)
            validate(name, x, dims, keepdim, dtype)
            return x.new_empty(out_shape(x, dims, keepdim), dtype=result_dtype(name, x, dtype))

        def setup(ctx, inputs, output):
            x, dim, keepdim, dtype = inputs
            ctx.meta = (tuple(dim), keepdim, x.shape, x.dtype, _count(x, tuple(dim)))

        def backward(ctx, g):
            dims, keepdim, shape, dtype, n = ctx.meta
            gx = _restore(g, len(shape), dims, keepdim).expand(shape).to(dtype)
            if name == "mean":
                gx = gx / n
            return gx, None, None, None
    elif name in ("amax", "amin"):
        schema = f"{name}(Tensor self, int[] dim, bool keepdim) -> Tensor"

        def impl(x, dim, keepdim):
            return _reduce(name, x, tuple(dim), keepdim)

        def fake(x, dim, keepdim):
            dims = tuple(dim)
            validate(name, x, dims, keepdim)
            return x.new_empty(out_shape(x, dims, keepdim))

        def setup(ctx, inputs, output):
            x, dim, keepdim = inputs
            ctx.save_for_backward(x, output)
            ctx.meta = (tuple(dim), keepdim)

        def backward(ctx, g):
            x, y = ctx.saved_tensors
            dims, keepdim = ctx.meta
            red = dims or tuple(range(x.dim()))
            mask = (x == _restore(y, x.dim(), dims, keepdim)).to(g.dtype)
            gx = _restore(g, x.dim(), dims, keepdim) / mask.sum(red, keepdim=True) * mask
            return gx, None, None
    elif name in ("argmax", "argmin"):
        schema = f"{name}(Tensor self, int? dim, bool keepdim) -> Tensor"

        def impl(x, dim, keepdim):
            return call(op, x, () if dim is None else (dim % _bmax(x.dim(), 1),) if x.dim() else (), keepdim)

        def fake(x, dim, keepdim):
            dims = canon_dims(name, x, dim, single=True)
            validate(name, x, dims, keepdim)
            return x.new_empty(out_shape(x, dims, keepdim), dtype=torch.int64)

        setup = backward = None
        vname = "max_dim" if name == "argmax" else "min_dim"

        def vimpl(x, dim, keepdim):
            v, i = call(op, x, (dim % x.dim(),) if x.dim() else (), keepdim, True)
            return v, i

        def vfake(x, dim, keepdim):
            dims = canon_dims(name, x, dim, single=True)
            validate(name, x, dims, keepdim)
            shape = out_shape(x, dims, keepdim)
            return x.new_empty(shape), x.new_empty(shape, dtype=torch.int64)

        def vsetup(ctx, inputs, output):
            x, dim, keepdim = inputs
            ctx.save_for_backward(output[1])
            ctx.meta = (x.shape, dim, keepdim, x.dim())

        def vbackward(ctx, gv, gi):
            (i,) = ctx.saved_tensors
            shape, dim, keepdim, nd = ctx.meta
            if nd == 0:
                return gv.clone(), None, None
            d = dim % nd
            if not keepdim:
                gv, i = gv.unsqueeze(d), i.unsqueeze(d)
            return gv.new_zeros(shape).scatter(d, i, gv), None, None

        define(f"{vname}(Tensor self, int dim, bool keepdim) -> (Tensor, Tensor)", vimpl, vfake, vbackward, vsetup)
    else:
        schema = f"{name}(Tensor self, int[] dim, float correction, bool keepdim) -> Tensor"

        def impl(x, dim, correction, keepdim):
            return call(op, x, tuple(dim), correction, keepdim)

        def fake(x, dim, correction, keepdim):
            dims = tuple(dim)
            validate(name, x, dims, correction, keepdim)
            return x.new_empty(out_shape(x, dims, keepdim))

        def setup(ctx, inputs, output):
            x, dim, correction, keepdim = inputs
            ctx.save_for_backward(x, output)
            ctx.meta = (tuple(dim), correction, keepdim)

        def backward(ctx, g):
            x, y = ctx.saved_tensors
            dims, correction, keepdim = ctx.meta
            red = dims or tuple(range(x.dim()))
            dof = _bmax(_count(x, dims) - correction, 0)
            centered = x - x.mean(red, keepdim=True)
            g = _restore(g, x.dim(), dims, keepdim)
            if name == "std":
                g = g / (2 * _restore(y, x.dim(), dims, keepdim))
            return g * (2.0 / dof if dof else math.inf) * centered, None, None, None
    define(schema, impl, fake, backward, setup)


for _n in NAMES:
    _define(_n)


# ---------------------------------------------------------------------------
# Public functions
# ---------------------------------------------------------------------------
_PACKETS = {n: getattr(torch.ops.opforge, n).default for n in NAMES}
_PACKETS["max_dim"] = torch.ops.opforge.max_dim.default
_PACKETS["min_dim"] = torch.ops.opforge.min_dim.default
_call = dispatch.call


def _flag(name, keepdim):
    if not isinstance(keepdim, bool):
        raise TypeError(f"opforge.{name}: keepdim must be a bool, got {type(keepdim).__name__}")
    return keepdim


def _check_input(name, x):
    check_tensor(f"opforge.{name}", "input", x, floating=False)


def sum(input: torch.Tensor, dim=None, keepdim: bool = False, *, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``torch.sum``: over ``dim`` (None: every dim); ints and bool accumulate in int64."""
    _check_input("sum", input)
    dims = canon_dims("sum", input, dim)
    if direct_ok(input):
        return _reduce("sum", input, dims, keepdim, dtype)
    validate("sum", input, dims, keepdim, dtype)
    return _PACKETS["sum"](input, list(dims), keepdim, dtype)


def mean(input: torch.Tensor, dim=None, keepdim: bool = False, *, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``torch.mean``: over ``dim`` (None: every dim); a floating result."""
    _check_input("mean", input)
    dims = canon_dims("mean", input, dim)
    if direct_ok(input):
        return _reduce("mean", input, dims, keepdim, dtype)
    validate("mean", input, dims, keepdim, dtype)
    return _PACKETS["mean"](input, list(dims), keepdim, dtype)


def _extreme(name):
    def fn(input: torch.Tensor, dim=None, keepdim: bool = False) -> torch.Tensor:
        _check_input(name, input)
        dims = canon_dims(name, input, dim)
        if direct_ok(input):
            return _reduce(name, input, dims, keepdim)
        validate(name, input, dims, keepdim)
        return _PACKETS[name](input, list(dims), keepdim)

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"``torch.{name}``: the {_WHAT[name]} over ``dim`` (None: every dim); NaN propagates."
    return fn


amax = _extreme("amax")
amin = _extreme("amin")


def _arg(name):
    def fn(input: torch.Tensor, dim: int | None = None, keepdim: bool = False) -> torch.Tensor:
        _check_input(name, input)
        dims = canon_dims(name, input, dim, single=True)
        if direct_ok(input):
            return _call(OPS[name], input, dims, keepdim)
        validate(name, input, dims, keepdim)
        return _PACKETS[name](input, None if dim is None else dims[0] if dims else 0, keepdim)

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = (f"``torch.{name}``: int64 index of the first {_WHAT[name][3:]} over ``dim`` "
                  f"(None: of the flattened input); NaN counts as the extreme.")
    return fn


argmax = _arg("argmax")
argmin = _arg("argmin")


def _max_min(name, arg, full, ret):
    def fn(input: torch.Tensor, dim: int | None = None, keepdim: bool = False):
        _check_input(name, input)
        if dim is None:
            if keepdim:
                raise TypeError(f"opforge.{name}: keepdim needs dim")
            if input.numel() == 0:
                raise ValueError(f"opforge.{name}: cannot reduce an empty tensor over every dim "
                                 f"(no identity for {name}); specify dim")
            return (amax if full == "amax" else amin)(input)
        dims = canon_dims(name, input, dim, single=True)
        x = input.view(torch.uint8) if input.dtype == torch.bool else input
        if x.numel() == 0 or not isinstance(keepdim, bool):
            validate(arg, x, dims, keepdim, alias=name)
        if direct_ok(x):
            v, i = _call(OPS[arg], x, dims, keepdim, True)
        else:
            validate(arg, x, dims, keepdim, alias=name)
            v, i = _PACKETS[f"{name}_dim"](x, dims[0] if dims else 0, keepdim)
        return ret((v.view(torch.bool) if input.dtype == torch.bool else v, i))

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = (f"``torch.{name}``: without ``dim`` the {name} of every element (0-dim); with an int "
                  f"``dim`` a ``torch.return_types.{name}`` of (values, indices), first index on ties.")
    return fn


max = _max_min("max", "argmax", "amax", torch.return_types.max)
min = _max_min("min", "argmin", "amin", torch.return_types.min)


def _moment(name):
    def fn(input: torch.Tensor, dim=None, *, correction=1, keepdim: bool = False) -> torch.Tensor:
        _check_input(name, input)
        dims = canon_dims(name, input, dim)
        if isinstance(correction, bool) or not isinstance(correction, (int, float)):
            raise TypeError(f"opforge.{name}: correction must be a number, got {type(correction).__name__}")
        correction = float(correction)
        if direct_ok(input):
            return _call(OPS[name], input, dims, correction, keepdim)
        validate(name, input, dims, correction, keepdim)
        return _PACKETS[name](input, list(dims), correction, keepdim)

    fn.__name__ = fn.__qualname__ = name
    what = "variance" if name == "var" else "standard deviation"
    fn.__doc__ = (f"``torch.{name}``: the {what} over ``dim`` (None: every dim) with ``correction`` "
                  f"(1: Bessel's); computed by a stable chunked Welford/Chan merge.")
    return fn


var = _moment("var")
std = _moment("std")

__all__ = ["sum", "mean", "amax", "amin", "max", "min", "argmax", "argmin", "var", "std"]

"""Stream compaction: ``opforge.compact`` and ``opforge.nonzero``.

``compact(x, mask)`` is ``x[mask]`` (mask of x's shape, or a 1-D mask over
dim 0 selecting rows); ``nonzero(mask)`` is ``torch.nonzero``. Both need the
number of kept elements to size the output: one device-to-host sync
(``mask.sum()``) unless ``size=`` is given, in which case the output has
``size`` rows: the first kept ones, then ``fill_value`` (like
``torch.nonzero_static``). The kernel is the scans' look-back
(``kernels.scan.launch_compact``): each kept element's slot is the exclusive
scan of the mask.

Variants, in dispatch order: ``triton_lookback``, ``torch_eager`` (CUDA),
``reference``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from opforge.kernels import scan as K
from opforge.ops.checks import check_tensor
from opforge.ops.device_gate import unmeasured
from opforge.ops.library import define, direct_ok
from opforge.runtime import dispatch, registry
from opforge.runtime.registry import Spec
from opforge.runtime.shapes import bucket_size

# Dtypes the compaction kernel moves (bool masks select; bool values are not moved).
VALUE_DTYPES = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.uint8, torch.int8,
                          torch.int16, torch.int32, torch.int64})


# ---------------------------------------------------------------------------
# Reference semantics (plain torch)
# ---------------------------------------------------------------------------
def _compact_ref(x, mask, size=None, fill_value=0):
    m = mask if mask.shape == x.shape else mask.reshape(-1)
    out = x[m]
    if size is None:
        return out
    res = torch.full((size, *out.shape[1:]), fill_value, dtype=x.dtype, device=x.device)
    k = min(size, out.shape[0])
    res[:k] = out[:k]
    return res


def _nonzero_ref(mask, size=None, fill_value=-1):
    if size is None:
        return torch.nonzero(mask)
    return torch.nonzero_static(mask, size=size, fill_value=fill_value)


REFERENCE = {"compact": _compact_ref, "nonzero": _nonzero_ref}


# ---------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------
def _rows_mode(x, mask) -> bool:
    return mask.shape != x.shape and mask.dim() == 1 and x.dim() >= 1 and mask.shape[0] == x.shape[0]


def _check_size(where, size):
    if size is None:
        return
    if isinstance(size, bool) or not isinstance(size, int):
        raise TypeError(f"{where}: size must be an int or None, got {type(size).__name__}")
    if size < 0:
        raise ValueError(f"{where}: size must be >= 0, got {size}")


def validate_compact(x, mask, size=None, fill_value=0):
    where = "opforge.compact"
    check_tensor(where, "input", x, floating=False)
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"{where}: mask must be a torch.Tensor, got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise TypeError(f"{where}: mask must be a bool tensor, got {mask.dtype}")
    if mask.shape != x.shape and not _rows_mode(x, mask):
        raise ValueError(f"{where}: mask has shape {tuple(mask.shape)}; expected input's shape "
                         f"{tuple(x.shape)} or a 1-D mask of {x.shape[0] if x.dim() else 0} rows")
    if mask.device != x.device:
        raise ValueError(f"{where}: mask is on {mask.device} but input is on {x.device}")
    _check_size(where, size)


def validate_nonzero(mask, size=None, fill_value=-1):
    where = "opforge.nonzero"
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"{where}: mask must be a torch.Tensor, got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise TypeError(f"{where}: mask must be a bool tensor, got {mask.dtype} (use mask != 0)")
    _check_size(where, size)


# ---------------------------------------------------------------------------
# Geometry and variants
# ---------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Geometry:
    """The mask's element count, whether it selects rows (a 1-D mask over dim
    0) and the values' dtype (None for nonzero); all in the memo key."""

    numel: int
    rows: bool
    dtype: torch.dtype | None


def compact_geometry(x, mask, *rest) -> Geometry:
    return Geometry(mask.numel(), _rows_mode(x, mask), x.dtype)


def nonzero_geometry(mask, *rest) -> Geometry:
    return Geometry(mask.numel(), False, None)


def _count(mask: torch.Tensor, size) -> int:
    """The output length: ``size`` when given, else the number kept (a host sync)."""
    return int(mask.sum()) if size is None else size


def compact_run(g: Geometry, cfg, x, mask, size=None, fill_value=0):
    k = _count(mask, size)
    m = mask.contiguous().reshape(-1)
    if g.rows:
        rows = x.shape[0]
        idx = torch.full((k,), rows, dtype=torch.int64, device=x.device)
        K.launch_compact(None, m, idx, True, cfg)
        xc = x.reshape(rows, -1)
        got = xc.index_select(0, idx.clamp(max=max(rows - 1, 0))) if rows else xc.new_empty((k, xc.shape[1]))
        if size is not None:
            got = torch.where((idx < rows)[:, None], got, torch.full_like(got, fill_value))
        return got.reshape((k, *x.shape[1:]))
    out = (torch.empty((k,), dtype=x.dtype, device=x.device) if size is None
           else torch.full((k,), fill_value, dtype=x.dtype, device=x.device))
    K.launch_compact(x.contiguous().reshape(-1), m, out, False, cfg)
    return out


def nonzero_run(g: Geometry, cfg, mask, size=None, fill_value=-1):
    k = _count(mask, size)
    n = g.numel
    flat = torch.full((k,), -1, dtype=torch.int64, device=mask.device)
    K.launch_compact(None, mask.contiguous().reshape(-1), flat, True, cfg)
    if mask.dim() == 0:
        return flat.new_empty((k, 0))
    coords = torch.stack(torch.unravel_index(flat.clamp(min=0, max=max(n - 1, 0)), mask.shape), 1)
    if size is not None:
        coords = torch.where((flat >= 0)[:, None], coords, torch.full_like(coords, fill_value))
    return coords


def value_check(g: Geometry) -> str | None:
    return None if g.dtype in VALUE_DTYPES else f"dtype {g.dtype} not supported"


def default_config(g: Geometry):
    """LATE (the LATE compaction kernel) once measured on the device: tiles of
    2048 with 4 warps from 2^20 elements (1.29 ms at fp32 2^28 on the H200,
    1.34x eager's x[mask], against 2.0 ms; 2026-12-02, rows_scan.py)."""
    cfg = K.compact_default_config(g.numel)
    if unmeasured("LATE"):
        return cfg
    return dict(cfg, BLOCK=2048, num_warps=4, LATE=1) if g.numel >= 1 << 20 else dict(cfg, LATE=1)


def configs(g: Geometry):
    base = [{"BLOCK": b, "num_warps": w, "WINDOW": 32} for b in (1024, 2048, 4096, 8192) for w in (4, 8)]
    return base if unmeasured("LATE") else base + [dict(c, LATE=1) for c in base]


def compact_bucket(g: Geometry) -> str:
    return f"{bucket_size(g.numel)}:{'rows' if g.rows else 'elems'}"


def nonzero_bucket(g: Geometry) -> str:
    return bucket_size(g.numel)


def torch_run(g: Geometry, cfg, *args):
    return (_compact_ref if g.dtype is not None else _nonzero_ref)(*args)


def specs(name: str) -> list[Spec]:
    """The variants of op ``name``, in dispatch order."""
    if name == "compact":
        lookback = Spec("triton_lookback", compact_run, version=K.COMPACT_VERSION, check=value_check,
                        configs=configs, default_config=default_config, bucket=compact_bucket,
                        description="look-back scan of the mask gives each kept element its slot; the tile "
                                    "scatters (rows: kept row indices, then a gather)")
        bucket, eager = compact_bucket, "x[mask]"
    else:
        lookback = Spec("triton_lookback", nonzero_run, version=K.COMPACT_VERSION, configs=configs,
                        default_config=default_config, bucket=nonzero_bucket,
                        description="look-back scan of the mask; kept flat indices, then unravel")
        bucket, eager = nonzero_bucket, "torch.nonzero / torch.nonzero_static"
    return [
        lookback,
        Spec("torch_eager", torch_run, kind="vendor", devices=("cuda",), bucket=bucket, description=eager),
        Spec("reference", torch_run, kind="reference", devices=("cpu", "cuda"),
             description="plain torch (the oracle and the CPU fallback)"),
    ]


# ---------------------------------------------------------------------------
# Selftest inputs
# ---------------------------------------------------------------------------
def sample_inputs(name: str, device: torch.device) -> list[tuple]:
    """Element and row masks over each dtype, a long mask (the look-back over
    many tiles), and ``size=`` (padding)."""
    g = torch.Generator(device="cpu").manual_seed(sum(map(ord, name)))

    def rand(shape, dtype):
        if not dtype.is_floating_point:
            return torch.randint(-3, 4, shape, generator=g).to(dtype).to(device)
        return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype).to(device)

    def bools(shape, p=0.5):
        return (torch.rand(shape, generator=g) < p).to(device)

    out: list[tuple] = []
    dts = (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int32)
    if name == "compact":
        for dt in dts:
            out += [(rand((1000,), dt), bools((1000,))), (rand((30, 40), dt), bools((30, 40), 0.3)),
                    (rand((50, 7), dt), bools((50,)))]
        out += [(rand((300000,), torch.float32), bools((300000,))),
                (rand((5000,), torch.float32), bools((5000,)), 3000, 0.0)]
    elif name == "nonzero":
        out += [(bools((1000,)),), (bools((30, 40), 0.3),), (bools((4, 5, 6), 0.1),), (bools((300000,)),),
                (bools((2000,)), 1500, -1)]
    return out


# ---------------------------------------------------------------------------
# Registration: registry entries + torch.library ops + autograd
# ---------------------------------------------------------------------------
def _compact_memo_key(x, mask, size=None, fill_value=0):
    return (x.dtype, x.shape, x.stride(), mask.shape, mask.stride(), x.device, size)


def _nonzero_memo_key(mask, size=None, fill_value=-1):
    return (mask.dtype, mask.shape, mask.stride(), mask.device, size)


def _first_tensor(t, *rest):
    return (t,)


def _dtype_key(x, *rest):
    return f"{x.dtype}".replace("torch.", "")


def _bool_key(mask, *rest):
    return "bool"


OPS = registry.register_family(
    ("compact", "nonzero"), specs,
    geometry=lambda name: compact_geometry if name == "compact" else nonzero_geometry,
    reference=REFERENCE.__getitem__,
    tensors=lambda name: _first_tensor,
    memo_key=lambda name: _compact_memo_key if name == "compact" else _nonzero_memo_key,
    dtype_key=lambda name: _dtype_key if name == "compact" else _bool_key,
    validate=lambda name: validate_compact if name == "compact" else validate_nonzero,
    samples=lambda name: functools.partial(sample_inputs, name),
    doc=lambda name: "x[mask], stable (stream compaction)" if name == "compact"
    else "indices of the true elements, [n, ndim] int64",
)


def _compact_shape(x, mask, n):
    return (n,) if not _rows_mode(x, mask) else (n, *x.shape[1:])


def _define_compact() -> None:
    op = OPS["compact"]

    def impl(x, mask, size, fill_value):
        return dispatch.call(op, x, mask, size, fill_value)

    def fake(x, mask, size, fill_value):
        validate_compact(x, mask, size, fill_value)
        n = size if size is not None else torch.library.get_ctx().new_dynamic_size()
        return x.new_empty(_compact_shape(x, mask, n))

    def setup(ctx, inputs, output):
        x, mask, size, fill_value = inputs
        ctx.shape = x.shape
        ctx.save_for_backward(mask)

    def backward(ctx, g):
        # Scatter back to the kept positions (padding rows go to a dropped extra row); no host sync.
        (mask,) = ctx.saved_tensors
        flat = mask.reshape(-1)
        n = flat.numel()
        pos = torch.nonzero_static(flat, size=g.shape[0], fill_value=n).flatten()
        inner = g.shape[1:]
        gx = torch.zeros((n + 1, *inner), dtype=g.dtype, device=g.device)
        gx = gx.index_put((pos,), g)
        return gx[:n].reshape(ctx.shape), None, None, None

    define("compact(Tensor self, Tensor mask, SymInt? size, Scalar fill_value) -> Tensor",
           impl, fake, backward, setup)


def _define_nonzero() -> None:
    op = OPS["nonzero"]

    def impl(mask, size, fill_value):
        return dispatch.call(op, mask, size, fill_value)

    def fake(mask, size, fill_value):
        validate_nonzero(mask, size, fill_value)
        n = size if size is not None else torch.library.get_ctx().new_dynamic_size()
        return mask.new_empty((n, mask.dim()), dtype=torch.int64)

    define("nonzero(Tensor mask, SymInt? size, int fill_value) -> Tensor", impl, fake)


_define_compact()
_define_nonzero()


# ---------------------------------------------------------------------------
# Public functions
# ---------------------------------------------------------------------------
def compact(input: torch.Tensor, mask: torch.Tensor, *, size: int | None = None, fill_value=0) -> torch.Tensor:
    """``input[mask]``, order kept. ``mask``: bool of input's shape (elements) or
    1-D over dim 0 (rows). Without ``size`` one host sync counts the kept
    elements; with it the output has ``size`` rows, padded with ``fill_value``."""
    if direct_ok(input, mask):
        return dispatch.call(OPS["compact"], input, mask, size, fill_value)
    validate_compact(input, mask, size, fill_value)
    return torch.ops.opforge.compact.default(input, mask, size, fill_value)


def nonzero(mask: torch.Tensor, *, size: int | None = None, fill_value: int = -1) -> torch.Tensor:
    """``torch.nonzero(mask)`` (int64 ``[n, ndim]``); with ``size`` like
    ``torch.nonzero_static`` (no host sync)."""
    validate_nonzero(mask, size, fill_value)
    if direct_ok(mask):
        return dispatch.call(OPS["nonzero"], mask, size, fill_value)
    return torch.ops.opforge.nonzero.default(mask, size, fill_value)


__all__ = ["compact", "nonzero"]

"""Data-movement ops: ``opforge.transpose(x, dim0, dim1)`` and ``opforge.permute(x, dims)``.

Both return a new **contiguous** tensor equal to ``x.transpose(dim0,
dim1).contiguous()`` / ``x.permute(dims).contiguous()`` (always a copy, never
the input itself, even when the result would already be contiguous). Torch
semantics: every real dtype (floats, 8-bit floats, integers, bool: the move
is bitwise, so NaN payloads and signed zeros are preserved), any leading
shape, any input strides (read in place, never copied first), negative
dims, empty tensors, 0-dim tensors (``dim0 = dim1 = 0`` or ``-1``; ``dims =
()``).

Each op is a registry entry with four variants, in dispatch order:
``triton_tiled`` (a true transpose: tiles through shared memory, coalesced
reads and writes), ``triton_gather`` (strided copies where the innermost dim
stays innermost, transposes with tiny planes such as ``[N, 3, 7]`` ->
``[N, 7, 3]``, inputs with no unit-stride dim; any layout up to six dims
after merging), ``torch_eager`` (torch's copy kernel, CUDA) and ``reference``
(plain torch). ``kernels/transpose.py`` explains the planning and the kernels.

Autograd: the gradient of a transpose is the same transpose of the incoming
gradient, of a permute the inverse permute; both run through these ops (so
through the kernels), and double backward follows for free.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from opforge.kernels import transpose as K
from opforge.ops.checks import check_tensor
from opforge.ops.library import define, direct_ok
from opforge.runtime import dispatch, registry
from opforge.runtime.registry import Spec
from opforge.runtime.shapes import bucket_size

NAMES = ("transpose", "permute")
# The kernels move bits: every dtype is viewed as the signed integer of its size.
_BITS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


# ---------------------------------------------------------------------------
# Reference semantics (plain torch, float64-capable)
# ---------------------------------------------------------------------------
def _transpose_ref(x, dim0, dim1):
    return x.transpose(dim0, dim1).clone(memory_format=torch.contiguous_format)


def _permute_ref(x, dims):
    return x.permute(tuple(dims)).clone(memory_format=torch.contiguous_format)


REFERENCE = {"transpose": _transpose_ref, "permute": _permute_ref}


# ---------------------------------------------------------------------------
# Validation and layout
# ---------------------------------------------------------------------------
def _check_input(where: str, x) -> None:
    check_tensor(where, "input", x, floating=False)
    if x.is_quantized:
        raise TypeError(f"{where}: quantized tensors are not supported (got input of {x.dtype})")


def _check_dim(where: str, arg: str, x: torch.Tensor, d) -> None:
    if isinstance(d, bool) or not isinstance(d, int):
        raise TypeError(f"{where}: {arg} must be an int, got {type(d).__name__}")
    n = max(x.dim(), 1)
    if not -n <= d < n:
        raise ValueError(f"{where}: {arg} {d} is out of range for a tensor with {x.dim()} dims "
                         f"(expected {-n} <= {arg} < {n})")


def validate_transpose(x, dim0=0, dim1=1) -> None:
    where = "opforge.transpose"
    _check_input(where, x)
    _check_dim(where, "dim0", x, dim0)
    _check_dim(where, "dim1", x, dim1)


def validate_permute(x, dims=()) -> None:
    where = "opforge.permute"
    _check_input(where, x)
    if isinstance(dims, torch.Tensor) or not isinstance(dims, (list, tuple)):
        raise TypeError(f"{where}: dims must be a list or tuple of ints, got {type(dims).__name__}")
    if len(dims) != x.dim():
        raise ValueError(f"{where}: dims has {len(dims)} entries but the input has {x.dim()} dims; "
                         f"dims must be a permutation of all of them")
    seen = set()
    for d in dims:
        _check_dim(where, "dims entry", x, d)
        d = d % x.dim() if x.dim() else 0
        if d in seen:
            raise ValueError(f"{where}: dims {tuple(dims)} repeats dim {d}; it must be a permutation")
        seen.add(d)


def transpose_perm(x: torch.Tensor, dim0: int, dim1: int) -> tuple[int, ...]:
    n = x.dim()
    perm = list(range(n))
    if n:
        a, b = dim0 % n, dim1 % n
        perm[a], perm[b] = perm[b], perm[a]
    return tuple(perm)


def permute_perm(x: torch.Tensor, dims) -> tuple[int, ...]:
    n = x.dim()
    return tuple(d % n for d in dims) if n else ()


PERM = {"transpose": transpose_perm, "permute": permute_perm}


def allocate_out(x: torch.Tensor, perm: tuple[int, ...]) -> torch.Tensor:
    """The dense result of ``x.permute(perm)``."""
    return torch.empty([x.shape[p] for p in perm], dtype=x.dtype, device=x.device)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(_BITS[t.element_size()])


# ---------------------------------------------------------------------------
# Geometry: the shape facts every variant decides and runs on
# ---------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Geometry:
    """One call's move, from what the memo key holds (dtype, shape, strides,
    dims): the permutation, its merged ``plan`` (``plan.tiled`` is the tiled
    kernel's view, or why it does not apply) and the element size."""

    perm: tuple[int, ...]
    plan: K.Plan
    itemsize: int


def geometry(name: str):
    """The geometry function of op ``name`` (its arguments: ``(x, dim0, dim1)`` or ``(x, dims)``)."""
    return functools.partial(_geometry, PERM[name])


def _geometry(perm_of, x: torch.Tensor, *rest) -> Geometry:
    perm = perm_of(x, *rest)
    return Geometry(perm, K.plan(tuple(x.shape), x.stride(), perm), x.element_size())


# ---------------------------------------------------------------------------
# Variants
# ---------------------------------------------------------------------------
def tiled_run(g: Geometry, cfg, x, *rest):
    out = allocate_out(x, g.perm)
    if g.plan.numel:
        K.launch_tiled(_bits(x), _bits(out), g.plan, g.plan.tiled, cfg)
    return out


def tiled_check(g: Geometry) -> str | None:
    tiled = g.plan.tiled
    return tiled if isinstance(tiled, str) else None


def tiled_default(g: Geometry):
    return K.tiled_default_config(g.plan.tiled, g.itemsize)


def tiled_configs(g: Geometry):
    return K.tiled_configs(g.plan.tiled, g.itemsize)


def tiled_bucket(g: Geometry) -> str:
    tiled = g.plan.tiled
    if isinstance(tiled, str):
        return "n/a"
    return f"{bucket_size(tiled.planes)}x{bucket_size(tiled.R)}x{bucket_size(tiled.C)}"


def gather_run(g: Geometry, cfg, x, *rest):
    out = allocate_out(x, g.perm)
    if g.plan.numel:
        K.launch_gather(_bits(x), _bits(out), g.plan, cfg)
    return out


def gather_check(g: Geometry) -> str | None:
    return K.gather_check(g.plan)


def gather_default(g: Geometry):
    return K.gather_default_config(g.plan, g.itemsize)


def gather_configs(g: Geometry):
    return K.gather_configs(g.plan, g.itemsize)


def gather_bucket(g: Geometry) -> str:
    p = g.plan
    C, sc = p.dims[-1]
    return f"{bucket_size(p.numel // C if C else 0)}x{bucket_size(C)}:{'u' if sc == 1 else 's'}{len(p.dims)}"


def reference_run(g: Geometry, cfg, x, *rest):
    """torch's copy kernel (``torch_eager``) and the reference alike: the permuted view, cloned."""
    return x.permute(g.perm).clone(memory_format=torch.contiguous_format)


def specs(name: str) -> list[Spec]:
    """The variants of op ``name``, in dispatch order."""
    return [
        Spec("triton_tiled", tiled_run, version=K.TILED_VERSION, check=tiled_check,
             configs=tiled_configs, default_config=tiled_default, bucket=tiled_bucket,
             description="batched 2-D transpose: [TILE_R, TILE_C] tiles read along the input's "
                         "unit-stride dim, transposed through shared memory, written along the "
                         "output's; up to 3 batch dims with any strides"),
        Spec("triton_gather", gather_run, version=K.GATHER_VERSION, check=gather_check,
             configs=gather_configs, default_config=gather_default, bucket=gather_bucket,
             description="rows of the output's innermost dim, each row decoded once into input "
                         "offsets; dense writes; strided copies and tiny transposes"),
        Spec("torch_eager", reference_run, kind="vendor", devices=("cuda",), bucket=gather_bucket,
             description="torch's copy kernel (.clone of the permuted view)"),
        Spec("reference", reference_run, kind="reference", devices=("cpu", "cuda"),
             description="plain torch (the oracle and the CPU fallback)"),
    ]


# ---------------------------------------------------------------------------
# Selftest inputs
# ---------------------------------------------------------------------------
def sample_inputs(name: str, device: torch.device) -> list[tuple]:
    """Inputs reaching both kernels for every element size: square and ragged
    matrices, batched and strided-copy layouts, tiny planes, tall-skinny,
    non-contiguous inputs, NaN/Inf, a few larger shapes; each dtype."""
    g = torch.Generator(device="cpu").manual_seed(sum(map(ord, name)))

    def rand(shape, dtype):
        if dtype == torch.bool:
            return (torch.rand(shape, generator=g) > 0.5).to(device)
        if dtype.is_floating_point:
            return (torch.randn(shape, generator=g, dtype=torch.float64) * 3).to(dtype).to(device)
        info = torch.iinfo(dtype)
        return torch.randint(max(info.min, -1000), min(info.max, 1000) + 1, shape, generator=g,
                             dtype=torch.int64).to(dtype).to(device)

    def make(x, d0, d1):
        if name == "transpose":
            return (x, d0, d1)
        return (x, tuple(transpose_perm(x, d0, d1)))

    out = []
    dtypes = (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int8, torch.uint8,
              torch.int16, torch.int32, torch.int64, torch.bool)
    for dt in dtypes:
        out += [make(rand((67, 130), dt), 0, 1),            # tiled, ragged edges
                make(rand((3, 40, 70), dt), -1, -2),        # tiled, batched
                make(rand((9, 4, 50), dt), 0, 1),           # gather, strided copy
                make(rand((20, 3, 7), dt), 1, 2)]           # gather, tiny planes
    f32, bf16 = torch.float32, torch.bfloat16
    nan = rand((33, 65), f32)
    nan[1, 2], nan[3, 4], nan[5, 6] = float("nan"), float("inf"), float("-inf")
    out += [
        make(nan, 0, 1),
        make(rand((130, 67), f32).t(), 0, 1),               # transposed input: a plain copy
        make(rand((40, 90), f32)[:, ::3], 0, 1),            # no unit-stride dim: gather
        make(rand((6, 40, 5, 64), bf16), 1, 3),             # [B, R, M, C] -> [B, C, M, R]
        make(rand((1000, 1000), f32), 0, 1),
        make(rand((8, 513, 257), bf16), 1, 2),
        make(rand((300000, 3), f32), 0, 1),                 # tall-skinny
        make(rand((3, 300000), f32), 0, 1),
        make(rand((256, 16, 512), bf16), 0, 1),             # strided copy, larger
        make(rand((2048, 2048), torch.int8), 0, 1),
    ]
    if name == "permute":
        x = rand((4, 5, 6, 7), f32)
        out += [(x, (3, 1, 0, 2)), (x, (1, 0, 2, 3)), (x, (2, 3, 0, 1)),
                (rand((2, 3, 4, 5, 6, 7), bf16), (5, 0, 4, 1, 3, 2))]
    return out


# ---------------------------------------------------------------------------
# Registration: registry entry + torch.library op + autograd
# ---------------------------------------------------------------------------
def _transpose_memo_key(x, dim0=0, dim1=1):
    return (x.dtype, x.shape, x.stride(), x.device, dim0, dim1)


def _permute_memo_key(x, dims=()):
    return (x.dtype, x.shape, x.stride(), x.device, tuple(dims))


def _tensors(x, *rest):
    return (x,)


def _dtype_key(x, *rest):
    return f"{x.dtype}".replace("torch.", "")


OPS = registry.register_family(
    NAMES, specs, geometry=geometry,
    reference=REFERENCE.__getitem__,
    tensors=lambda name: _tensors,
    memo_key={"transpose": _transpose_memo_key, "permute": _permute_memo_key}.__getitem__,
    dtype_key=lambda name: _dtype_key,
    validate={"transpose": validate_transpose, "permute": validate_permute}.__getitem__,
    samples=lambda name: functools.partial(sample_inputs, name),
    doc={"transpose": "transpose two dims into a new contiguous tensor",
         "permute": "permute dims into a new contiguous tensor"}.__getitem__,
)


def _define_transpose() -> None:
    op = OPS["transpose"]

    def impl(x, dim0, dim1):
        return dispatch.call(op, x, dim0, dim1)

    def fake(x, dim0, dim1):
        validate_transpose(x, dim0, dim1)
        return allocate_out(x, transpose_perm(x, dim0, dim1))

    def setup(ctx, inputs, output):
        ctx.dims = inputs[1:]

    def backward(ctx, g):
        return torch.ops.opforge.transpose(g, *ctx.dims), None, None

    define("transpose(Tensor self, int dim0, int dim1) -> Tensor", impl, fake, backward, setup)


def _define_permute() -> None:
    op = OPS["permute"]

    def impl(x, dims):
        return dispatch.call(op, x, tuple(dims))

    def fake(x, dims):
        validate_permute(x, dims)
        return allocate_out(x, permute_perm(x, dims))

    def setup(ctx, inputs, output):
        x, dims = inputs
        perm = permute_perm(x, dims)
        inverse = [0] * len(perm)
        for i, p in enumerate(perm):
            inverse[p] = i
        ctx.inverse = inverse

    def backward(ctx, g):
        return torch.ops.opforge.permute(g, ctx.inverse), None

    define("permute(Tensor self, int[] dims) -> Tensor", impl, fake, backward, setup)


_define_transpose()
_define_permute()

_call = dispatch.call
_transpose_packet = torch.ops.opforge.transpose.default
_permute_packet = torch.ops.opforge.permute.default


def transpose(input: torch.Tensor, dim0: int, dim1: int) -> torch.Tensor:
    """``input.transpose(dim0, dim1).contiguous()`` as a new tensor, run by opforge's dispatcher."""
    if direct_ok(input) and type(dim0) is int and type(dim1) is int:
        return _call(OPS["transpose"], input, dim0, dim1)
    validate_transpose(input, dim0, dim1)
    return _transpose_packet(input, dim0, dim1)


def permute(input: torch.Tensor, dims) -> torch.Tensor:
    """``input.permute(dims).contiguous()`` as a new tensor, run by opforge's dispatcher."""
    if direct_ok(input) and type(dims) in (tuple, list) and all(type(d) is int for d in dims):
        return _call(OPS["permute"], input, tuple(dims))
    validate_permute(input, dims)
    return _permute_packet(input, list(dims))


__all__ = ["transpose", "permute"]

"""Softmax ops: ``opforge.softmax(x, dim=-1)`` and ``opforge.log_softmax(x, dim=-1)``.

Torch semantics: the dtype is preserved (fp16, bf16, fp32, fp64; arithmetic
in fp32, or fp64 for fp64), any dim, any leading shape, empty tensors,
0-dim tensors. NaN and infinities behave as torch's.

Layout. The kernels reduce the last dim of a 2-D ``[rows, cols]`` view whose
column stride is 1. ``dim`` is moved last with ``movedim`` (a view); the
input is copied to a contiguous tensor only when that view cannot be seen as
``[rows, cols]`` with unit column stride (``dim`` is not the innermost dim,
or the leading dims do not collapse, e.g. a transposed input). The output is
allocated dense in the moved layout and returned moved back: for the last dim
that is a contiguous tensor; for another dim it is a permuted view of a dense
tensor (same values and shape as torch's, different strides; no extra copy).

Each op is a registry entry with four variants, in dispatch order:
``triton_row`` (the row in registers, cols <= ``ROW_LIMIT``),
``triton_split`` (a long row cut into chunks held in registers by
cooperating programs, up to ``SPLIT_MAX_PARTS`` chunks),
``triton_online`` (online softmax over column blocks, any cols),
``torch_eager`` (torch's own kernel, CUDA) and ``reference`` (plain torch).
The backward ops ``softmax_backward(grad, output, dim)`` and
``log_softmax_backward(grad, output, dim)`` are registry and torch.library
ops too, with the same variants: autograd calls them, so they are
dispatched, tuned and selftested like the forward ops.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable

import torch

from opforge.kernels import softmax as K

from opforge.ops.checks import check_dim, check_tensor
from opforge.ops.device_gate import unmeasured
from opforge.ops.library import define, direct_ok
from opforge.runtime import dispatch, registry
from opforge.runtime.device import interpret_mode
from opforge.runtime.launch import Launcher
from opforge.runtime.registry import Spec
from opforge.runtime.shapes import bucket_size, empty_moved, norm_dim, rows_view

FLOATS = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})
FORWARD = ("softmax", "log_softmax")
BACKWARD = ("softmax_backward", "log_softmax_backward")


# ---------------------------------------------------------------------------
# Reference semantics (plain torch, float64-capable)
# ---------------------------------------------------------------------------
def _softmax_ref(x, dim):
    return torch.softmax(x, dim)


def _log_softmax_ref(x, dim):
    return torch.log_softmax(x, dim)


def _softmax_backward_ref(g, y, dim):
    return y * (g - (g * y).sum(dim, keepdim=True))


def _log_softmax_backward_ref(g, y, dim):
    return g - torch.exp(y) * g.sum(dim, keepdim=True)


REFERENCE = {
    "softmax": _softmax_ref,
    "log_softmax": _log_softmax_ref,
    "softmax_backward": _softmax_backward_ref,
    "log_softmax_backward": _log_softmax_backward_ref,
}


def _eager_backward(name):
    def run(g, y, dim):
        if name == "softmax_backward":
            return torch.ops.aten._softmax_backward_data(g, y, dim, g.dtype)
        return torch.ops.aten._log_softmax_backward_data(g, y, dim, g.dtype)
    return run


EAGER = {
    "softmax": lambda x, dim: torch.softmax(x, dim),
    "log_softmax": lambda x, dim: torch.log_softmax(x, dim),
    "softmax_backward": _eager_backward("softmax_backward"),
    "log_softmax_backward": _eager_backward("log_softmax_backward"),
}


# ---------------------------------------------------------------------------
# Validation and layout
# ---------------------------------------------------------------------------
def validate(name: str, x, dim=-1) -> None:
    where = f"opforge.{name}"
    check_tensor(where, "input", x)
    check_dim(where, x, dim)


def validate_backward(name: str, g, y, dim=-1) -> None:
    where = f"opforge.{name}"
    check_tensor(where, "grad", g)
    check_tensor(where, "output", y)
    if g.shape != y.shape:
        raise ValueError(f"{where}: grad has shape {tuple(g.shape)} but output has {tuple(y.shape)}")
    if g.dtype != y.dtype:
        raise TypeError(f"{where}: grad is {g.dtype} but output is {y.dtype}; they must match")
    if g.device != y.device:
        raise ValueError(f"{where}: grad is on {g.device} but output is on {y.device}")
    check_dim(where, g, dim)


def column_case(x: torch.Tensor, dim: int) -> bool:
    """A contiguous tensor reduced over a dim that is not innermost: the column
    kernels take it as it lies, and the output is contiguous like the input."""
    if x.dim() < 2 or x.numel() == 0 or not x.is_contiguous():
        return False
    d = norm_dim(x, dim)
    return d < x.dim() - 1 and x.shape[d] > 1 and math.prod(x.shape[d + 1:]) > 1


def allocate_out(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Contiguous in the column case, else dense in the moved layout (``dim``
    last) returned with ``dim`` back in place. The layout depends only on the
    input, never on the variant, so the fake implementation can match it."""
    if column_case(x, dim):
        return torch.empty(x.shape, dtype=x.dtype, device=x.device)
    return empty_moved(x, dim)


def _three_d(x: torch.Tensor, d: int) -> tuple[int, int, int]:
    R = x.shape[d]
    inner = math.prod(x.shape[d + 1:])
    return x.numel() // (R * inner), R, inner


def _run_rows(launch, out: torch.Tensor, dim: int, inputs: tuple, log: bool, cfg) -> torch.Tensor:
    """Run a row kernel into ``out``, through a moved-layout buffer when ``out``
    cannot be seen as rows (the column case, forced onto a row kernel)."""
    if out.numel() == 0:
        return out
    buffer = out
    rows = rows_view(out, dim)
    if rows.data_ptr() != out.data_ptr():  # rows_view had to copy
        buffer = empty_moved(out, dim)
        rows = rows_view(buffer, dim)
    launch(*[rows_view(t, dim) for t in inputs], rows, log, cfg)
    if buffer is not out:
        out.copy_(buffer)
    return out


# ---------------------------------------------------------------------------
# Geometry: the shape facts every variant decides and runs on
# ---------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Geometry:
    """One call's shape facts, from what the memo key holds (dtype, shapes,
    strides, dim). ``tensors`` counts the inputs (1 forward, 2 backward);
    ``column``: every input is the column case; ``out_column``: the output is
    allocated contiguous (the first input is); ``three_d``: ``[outer, R,
    inner]`` around the dim (zeros when empty or 0-dim); ``layout``: the bucket's
    suffix (``c`` unit-stride dim, ``k`` column case, ``t`` moved by a copy)."""

    log: bool
    backward: bool
    dim: int
    rows: int
    cols: int
    column: bool
    out_column: bool
    three_d: tuple[int, int, int]
    itemsize: int
    layout: str


def geometry(name: str):
    """The geometry function of op ``name`` (its arguments: ``(x, dim)`` or ``(grad, output, dim)``)."""
    return functools.partial(_geometry, name.startswith("log_"), name in BACKWARD)


def _geometry(log: bool, backward: bool, t: torch.Tensor, *rest) -> Geometry:
    dim = rest[-1] if rest and not isinstance(rest[-1], torch.Tensor) else -1
    tensors = (t, rest[0]) if backward else (t,)
    d = norm_dim(t, dim)
    cols = t.shape[d] if t.dim() else 1
    rows = t.numel() // cols if cols else 0
    out_column = column_case(t, dim)
    unit = t.dim() == 0 or t.stride(d) == 1 or cols <= 1
    return Geometry(log, backward, dim, rows, cols, out_column and all(column_case(u, dim) for u in tensors[1:]),
                    out_column, _three_d(t, d) if t.dim() and t.numel() else (0, 0, 0), t.element_size(),
                    "c" if unit else ("k" if out_column else "t"))


def _inputs(g: Geometry, args: tuple) -> tuple:
    return args[:2] if g.backward else args[:1]


def _out(g: Geometry, t: torch.Tensor) -> torch.Tensor:
    return torch.empty(t.shape, dtype=t.dtype, device=t.device) if g.out_column else empty_moved(t, g.dim)


# ---------------------------------------------------------------------------
# Variants: runners, then each variant's checks and configs, then the specs
# ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Rows:
    """A row kernel pair over ``[rows, cols]`` views, forward ``launch(x,
    out, log, cfg)`` and backward ``launch(g, y, out, log, cfg)``."""

    forward: Callable
    backward: Callable

    def __call__(self, g: Geometry, cfg, *args):
        inputs = _inputs(g, args)
        return _run_rows(self.backward if g.backward else self.forward, _out(g, inputs[0]), g.dim, inputs, g.log, cfg)

    def bind(self, g: Geometry, cfg, args):
        """The row kernel's forward over the last dim of a contiguous input, for
        one decision: the input and a new contiguous output are the ``[rows,
        cols]`` views themselves (row stride ``cols``), so a call allocates the
        output and launches; grid and constexprs are fixed here."""
        x = args[0]
        if (self.forward is not K.launch_row_forward or g.backward or g.out_column or not g.rows
                or x.dim() == 0 or norm_dim(x, g.dim) != x.dim() - 1 or not x.is_contiguous()):
            return None
        rows, cols = g.rows, g.cols
        grid, kw = K.row_options(rows, cols, (cols, cols), x.dtype, g.log, cfg)
        go, shape, dtype, device, empty = Launcher(K.row_forward_kernel, **kw), x.shape, x.dtype, x.device, torch.empty

        def run(x, dim=-1):
            y = empty(shape, dtype=dtype, device=device)
            go(grid, x, y, rows, cols, cols, cols)
            return y
        return run


@dataclass(frozen=True)
class Columns:
    """A column kernel pair over a contiguous ``[outer, R, inner]`` tensor."""

    forward: Callable
    backward: Callable

    def __call__(self, g: Geometry, cfg, *args):
        inputs = _inputs(g, args)
        out = _out(g, inputs[0])
        if out.numel():
            (self.backward if g.backward else self.forward)(*inputs, out, *g.three_d, g.log, cfg)
        return out


def eager_run(g: Geometry, cfg, *args):
    name = ("log_softmax" if g.log else "softmax") + ("_backward" if g.backward else "")
    return EAGER[name](*args)


def _bind_eager(g: Geometry, cfg, args):
    if g.backward:
        return EAGER[("log_softmax" if g.log else "softmax") + "_backward"]
    return torch.log_softmax if g.log else torch.softmax  # what EAGER's forward lambdas call


eager_run.bind = _bind_eager


def reference_run(g: Geometry, cfg, *args):
    name = ("log_softmax" if g.log else "softmax") + ("_backward" if g.backward else "")
    return _out(g, args[0]).copy_(REFERENCE[name](*args))


def col_check(g: Geometry) -> str | None:
    if not g.column:
        return "takes contiguous inputs reduced over a dim that is not innermost"
    return None


def col_split_check(g: Geometry) -> str | None:
    reason = col_check(g)
    if reason is not None:
        return reason
    outer, R, inner = g.three_d
    if outer * -(-inner // 64) >= K.COL_WALK_MIN_TILES:
        return "enough column tiles to fill the GPU without cutting the dim (triton_col is faster)"
    if interpret_mode() and K.col_split_parts(R, col_split_default(g)) > 1:
        return "the programs of a column wait for each other, which the interpreter cannot run"
    return None


def col_split_default(g: Geometry):
    return K.col_split_default_config(*g.three_d, g.itemsize)


def col_split_configs(g: Geometry):
    return K.col_split_configs(*g.three_d)


def col_default(g: Geometry):
    return K.col_default_config(*g.three_d)


def col_configs(g: Geometry):
    return K.col_configs(*g.three_d)


def row_check(g: Geometry) -> str | None:
    if g.cols > K.ROW_LIMIT:
        return f"rows of {g.cols} columns exceed the row-resident limit {K.ROW_LIMIT}"
    return None


def row_default(g: Geometry):
    return K.row_default_config(g.rows, g.cols)


def row_configs(g: Geometry):
    return K.row_configs(g.rows, g.cols)


def split_check(g: Geometry) -> str | None:
    parts = K.split_parts(g.cols, K.split_default_config(g.rows, g.cols)["CHUNK"])
    if parts > K.SPLIT_MAX_PARTS:
        return f"rows of {g.cols} columns need more than {K.SPLIT_MAX_PARTS} programs each"
    if parts > 1 and interpret_mode():
        return "the programs of a row wait for each other, which the interpreter cannot run"
    return None


def split_default(g: Geometry):
    return K.split_default_config(g.rows, g.cols)


def split_configs(g: Geometry):
    return K.split_configs(g.rows, g.cols)


def wave_check(g: Geometry) -> str | None:
    if g.backward:
        return "forward only (the backward's long rows take triton_split)"
    if g.cols <= K.ROW_LIMIT:
        return f"rows of {g.cols} columns fit the row-resident kernel"
    return unmeasured("triton_wave")


def wave_default(g: Geometry):
    return K.wave_default_config(g.rows, g.cols, g.itemsize)


def wave_configs(g: Geometry):
    return K.wave_configs(g.rows, g.cols, g.itemsize)


def online_default(g: Geometry):
    return K.online_default_config(g.rows, g.cols)


def online_configs(g: Geometry):
    return K.online_configs(g.rows, g.cols)


def bucket(g: Geometry) -> str:
    return f"{bucket_size(g.rows)}x{bucket_size(g.cols)}:{g.layout}"


def specs(name: str) -> list[Spec]:
    """The variants of op ``name``, in dispatch order."""
    what = "gradient" if name in BACKWARD else "row"
    return [
        Spec("triton_col_split", Columns(K.launch_col_split_forward, K.launch_col_split_backward),
             version=K.COL_SPLIT_VERSION, dtypes=FLOATS, check=col_split_check, configs=col_split_configs,
             default_config=col_split_default, bucket=bucket,
             description="over a dim that is not innermost: the dim cut into chunks held in registers "
                         "by cooperating programs; one read, one write"),
        Spec("triton_col", Columns(K.launch_col_forward, K.launch_col_backward), version=K.COL_VERSION,
             dtypes=FLOATS, check=col_check, configs=col_configs, default_config=col_default, bucket=bucket,
             description="over a dim that is not innermost of a contiguous tensor: columns "
                         "coalesced, online max and sum down the dim, no transpose copy"),
        Spec("triton_row", Rows(K.launch_row_forward, K.launch_row_backward), version=K.ROW_VERSION,
             dtypes=FLOATS, check=row_check, configs=row_configs, default_config=row_default, bucket=bucket,
             description=f"the whole {what} in registers, several short rows per program; "
                         f"cols <= {K.ROW_LIMIT}"),
        Spec("triton_wave", Rows(K.launch_wave_forward, None), version=K.WAVE_VERSION, dtypes=FLOATS,
             check=wave_check, configs=wave_configs, default_config=wave_default, bucket=bucket,
             description="forward: a long row's pieces, their max/sum and their writes in one grid, "
                         "interleaved by waves of rows so the re-read hits L2 (one HBM read)"),
        Spec("triton_split", Rows(K.launch_split_forward, K.launch_split_backward), version=K.SPLIT_VERSION,
             dtypes=FLOATS, check=split_check, configs=split_configs, default_config=split_default,
             bucket=bucket,
             description=f"a long {what} cut into chunks held in registers by cooperating programs "
                         f"that exchange partial sums; one read, one write"),
        Spec("triton_online", Rows(K.launch_online_forward, K.launch_online_backward), version=K.ONLINE_VERSION,
             dtypes=FLOATS, configs=online_configs, default_config=online_default, bucket=bucket,
             description="one program per row over column blocks (running max and sum), "
                         "then a second pass that writes; any cols"),
        Spec("torch_eager", eager_run, kind="vendor", devices=("cuda",), dtypes=FLOATS, bucket=bucket,
             description="torch's own softmax kernel"),
        Spec("reference", reference_run, kind="reference", devices=("cpu", "cuda"),
             description="plain torch (the oracle and the CPU fallback)"),
    ]


# ---------------------------------------------------------------------------
# Selftest inputs
# ---------------------------------------------------------------------------
def sample_inputs(name: str, device: torch.device) -> list[tuple]:
    """Random inputs reaching every variant: short rows, long rows (70000
    columns: the online kernel only), another dim, a transposed input,
    magnitudes near 1e4; each float dtype."""
    g = torch.Generator(device="cpu").manual_seed(sum(map(ord, name)))
    backward = name in BACKWARD

    def rand(shape, dtype, scale=3.0):
        return (torch.randn(shape, generator=g, dtype=torch.float64) * scale).to(dtype).to(device)

    def make(x, dim):
        if not backward:
            return (x, dim)
        fwd = torch.log_softmax if name.startswith("log_") else torch.softmax
        y = fwd(x.double(), dim).to(x.dtype)
        return (rand(x.shape, x.dtype, 1.0), y, dim)

    out = []
    for dt in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        out += [make(rand((67, 130), dt), -1), make(rand((5, 7, 33), dt), 1),
                make(rand((130, 67), dt).t(), -1), make(rand((9, 1000), dt), -1)]
    out.append(make(rand((3, 70000), torch.float32), -1))
    out.append(make(rand((4, 300), torch.float32, 1e4), -1))
    out.append(make(rand((2, 20000), torch.bfloat16), -1))
    return out


# ---------------------------------------------------------------------------
# Registration: registry entry + torch.library op + autograd
# ---------------------------------------------------------------------------
def _memo_key(x, dim=-1):
    # A CUDA device as its index: building and comparing torch.device objects costs more than the rest.
    return (x.dtype, x.shape, x.stride(), x.get_device() if x.is_cuda else x.device, dim)


def _backward_memo_key(g, y, dim=-1):
    return (g.dtype, g.shape, g.stride(), y.stride(), y.dtype, g.device, dim)


def _dtype_key(t, *rest):
    return f"{t.dtype}".replace("torch.", "")


def _forward_tensors(x, dim=-1):
    return (x,)


def _backward_tensors(g, y, dim=-1):
    return (g, y)


OPS = registry.register_family(
    FORWARD + BACKWARD, specs, geometry=geometry,
    reference=REFERENCE.__getitem__,
    tensors=lambda name: _backward_tensors if name in BACKWARD else _forward_tensors,
    memo_key=lambda name: _backward_memo_key if name in BACKWARD else _memo_key,
    dtype_key=lambda name: _dtype_key,
    validate=lambda name: functools.partial(validate_backward if name in BACKWARD else validate, name),
    samples=lambda name: functools.partial(sample_inputs, name),
    doc=lambda name: f"gradient of {name[:-len('_backward')]} from its output" if name in BACKWARD
    else f"{name} over one dim",
)


def _define_backward(name: str) -> None:
    op = OPS[name]
    log = name.startswith("log_")

    def impl(g, y, dim):
        return dispatch.call(op, g, y, dim)

    def fake(g, y, dim):
        validate_backward(name, g, y, dim)
        return allocate_out(g, dim)

    def setup(ctx, inputs, output):
        g, y, dim = inputs
        ctx.save_for_backward(g, y)
        ctx.dim = dim

    def backward(ctx, gg):
        # Second derivatives, in plain torch (double backward is rare).
        g, y = ctx.saved_tensors
        dim = ctx.dim
        if log:
            ey = torch.exp(y)
            d_g = gg - (gg * ey).sum(dim, keepdim=True)
            d_y = -gg * ey * g.sum(dim, keepdim=True)
        else:
            s = (g * y).sum(dim, keepdim=True)
            d_g = y * (gg - (gg * y).sum(dim, keepdim=True))
            d_y = gg * (g - s) - g * (gg * y).sum(dim, keepdim=True)
        return d_g, d_y, None

    define(f"{name}(Tensor grad, Tensor output, int dim) -> Tensor", impl, fake, backward, setup)


def _define_forward(name: str) -> None:
    op = OPS[name]

    def impl(x, dim):
        return dispatch.call(op, x, dim)

    def fake(x, dim):
        validate(name, x, dim)
        return allocate_out(x, dim)

    def setup(ctx, inputs, output):
        ctx.save_for_backward(output)
        ctx.dim = inputs[1]

    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return getattr(torch.ops.opforge, f"{name}_backward")(g, y, ctx.dim), None

    define(f"{name}(Tensor self, int dim) -> Tensor", impl, fake, backward, setup)


for _n in BACKWARD:
    _define_backward(_n)
for _n in FORWARD:
    _define_forward(_n)


def _public(name: str):
    """The torch-style function: the registered op, with a direct path to the
    dispatcher when nothing (autograd, tracing, modes) needs torch.library."""
    packet = getattr(torch.ops.opforge, name).default
    op = OPS[name]
    call = dispatch.call

    def fn(input: torch.Tensor, dim: int = -1) -> torch.Tensor:
        if direct_ok(input) and type(dim) is int:
            return call(op, input, dim)
        validate(name, input, dim)
        return packet(input, dim)

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = (f"``torch.{name}(input, dim)`` over ``dim`` (default the last), dtype preserved, "
                  f"run by opforge's dispatcher.")
    return fn


softmax = _public("softmax")
log_softmax = _public("log_softmax")

__all__ = ["softmax", "log_softmax"]

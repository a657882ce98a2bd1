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

import torch

from opforge.ops.checks import check_dim, check_tensor
from opforge.ops.library import define, direct_ok
from opforge.runtime import dispatch, registry
from opforge.runtime.device import interpret_mode
from opforge.runtime.registry import Op, Variant
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


def _cols(t: torch.Tensor, dim: int) -> int:
    return t.shape[norm_dim(t, dim)] if t.dim() else 1


def _three_d(x: torch.Tensor, dim: int) -> tuple[int, int, int]:
    d = norm_dim(x, dim)
    R = x.shape[d]
    inner = math.prod(x.shape[d + 1:])
    return x.numel() // (R * inner), R, inner


def _run_rows(launch, out: torch.Tensor, dim: int, *inputs: torch.Tensor) -> torch.Tensor:
    """Run a row kernel into ``out``, through a moved-layout buffer when ``out``
    cannot be seen as rows (the column case, forced onto a row kernel)."""
    if out.numel() == 0:
        return out
    buffer = out
    rows = rows_view(out, dim)
    if rows.data_ptr() != out.data_ptr():  # rows_view had to copy
        buffer = empty_moved(out, dim)
        rows = rows_view(buffer, dim)
    launch(*[rows_view(t, dim) for t in inputs], rows)
    if buffer is not out:
        out.copy_(buffer)
    return out


# ---------------------------------------------------------------------------
# Variants
# ---------------------------------------------------------------------------
def _geometry(t: torch.Tensor, dim: int) -> tuple[int, int]:
    cols = _cols(t, dim)
    return (t.numel() // cols if cols else 0), cols


def _make_variants(name: str) -> list[Variant]:
    from opforge.kernels import softmax as K

    backward = name in BACKWARD
    log = name.startswith("log_")

    def rows_variant(forward_launch, backward_launch):
        if backward:
            def run(cfg, g, y, dim=-1):
                return _run_rows(lambda *t: backward_launch(*t, log, cfg), allocate_out(g, dim), dim, g, y)
        else:
            def run(cfg, x, dim=-1):
                return _run_rows(lambda *t: forward_launch(*t, log, cfg), allocate_out(x, dim), dim, x)
        return run

    row_run = rows_variant(K.launch_row_forward, K.launch_row_backward)
    split_run = rows_variant(K.launch_split_forward, K.launch_split_backward)
    online_run = rows_variant(K.launch_online_forward, K.launch_online_backward)

    def columns_variant(forward_launch, backward_launch):
        def run(cfg, *args):
            *tensors, dim = args
            out = allocate_out(tensors[0], dim)
            if out.numel():
                (backward_launch if backward else forward_launch)(*tensors, out, *_three_d(out, dim), log, cfg)
            return out
        return run

    col_run = columns_variant(K.launch_col_forward, K.launch_col_backward)
    col_split_run = columns_variant(K.launch_col_split_forward, K.launch_col_split_backward)

    def col_split_check(*args):
        reason = col_check(*args)
        if reason is not None:
            return reason
        outer, R, inner = _three_d(args[0], args[-1])
        if outer * -(-inner // 64) >= K.COL_WALK_MIN_TILES:
            return "enough column tiles to fill the GPU without cutting the dim (triton_col is faster)"
        if interpret_mode() and K.col_split_parts(R, col_split_default(*args)) > 1:
            return "the programs of a column wait for each other, which the interpreter cannot run"
        return None

    def col_split_default(*args):
        return K.col_split_default_config(*_three_d(args[0], args[-1]), args[0].element_size())

    def col_split_configs(*args):
        return K.col_split_configs(*_three_d(args[0], args[-1]))

    def col_check(*args):
        *tensors, dim = args
        if not all(column_case(t, dim) for t in tensors):
            return "takes contiguous inputs reduced over a dim that is not innermost"
        return None

    def col_default(*args):
        return K.col_default_config(*_three_d(args[0], args[-1]))

    def col_configs(*args):
        return K.col_configs(*_three_d(args[0], args[-1]))

    def _dim(rest):
        return rest[-1] if rest and not isinstance(rest[-1], torch.Tensor) else -1

    def row_check(t, *rest):
        cols = _cols(t, _dim(rest))
        if cols > K.ROW_LIMIT:
            return f"rows of {cols} columns exceed the row-resident limit {K.ROW_LIMIT}"
        return None

    def split_check(t, *rest):
        rows, cols = _geometry(t, _dim(rest))
        parts = K.split_parts(cols, K.split_default_config(rows, cols)["CHUNK"])
        if parts > K.SPLIT_MAX_PARTS:
            return f"rows of {cols} columns need more than {K.SPLIT_MAX_PARTS} programs each"
        if parts > 1 and interpret_mode():
            return "the programs of a row wait for each other, which the interpreter cannot run"
        return None

    def split_default(t, *rest):
        return K.split_default_config(*_geometry(t, _dim(rest)))

    def split_configs(t, *rest):
        return K.split_configs(*_geometry(t, _dim(rest)))

    def bucket(t, *rest):
        # ":c" when dim is the unit-stride one (no copy), ":k" for the column case
        # (contiguous, dim not innermost), ":t" when dim is moved by a copy.
        dim = _dim(rest)
        rows, cols = _geometry(t, dim)
        unit = t.dim() == 0 or t.stride(norm_dim(t, dim)) == 1 or cols <= 1
        layout = "c" if unit else ("k" if column_case(t, dim) else "t")
        return f"{bucket_size(rows)}x{bucket_size(cols)}:{layout}"

    def row_default(t, *rest):
        return K.row_default_config(*_geometry(t, _dim(rest)))

    def row_configs(t, *rest):
        return K.row_configs(*_geometry(t, _dim(rest)))

    def online_default(t, *rest):
        return K.online_default_config(*_geometry(t, _dim(rest)))

    def online_configs(t, *rest):
        return K.online_configs(*_geometry(t, _dim(rest)))

    def eager_run(cfg, *args):
        return EAGER[name](*args)

    def reference_run(cfg, *args):
        out = allocate_out(args[0], args[-1])
        return out.copy_(REFERENCE[name](*args))

    what = "gradient" if backward else "row"
    return [
        Variant("triton_col_split", col_split_run, version=K.COL_SPLIT_VERSION, dtypes=FLOATS,
                check=col_split_check, configs=col_split_configs, default_config=col_split_default,
                bucket=bucket,
                description="over a dim that is not innermost: the dim cut into chunks held in registers "
                            "by cooperating programs; one read, one write"),
        Variant("triton_col", col_run, version=K.COL_VERSION, dtypes=FLOATS, check=col_check,
                configs=col_configs, default_config=col_default, bucket=bucket,
                description="over a dim that is not innermost of a contiguous tensor: columns "
                            "coalesced, online max and sum down the dim, no transpose copy"),
        Variant("triton_row", row_run, version=K.ROW_VERSION, dtypes=FLOATS, check=row_check,
                configs=row_configs, default_config=row_default, bucket=bucket,
                description=f"the whole {what} in registers, several short rows per program; "
                            f"cols <= {K.ROW_LIMIT}"),
        Variant("triton_split", split_run, version=K.SPLIT_VERSION, dtypes=FLOATS, check=split_check,
                configs=split_configs, default_config=split_default, bucket=bucket,
                description=f"a long {what} cut into chunks held in registers by cooperating programs "
                            f"that exchange partial sums; one read, one write"),
        Variant("triton_online", online_run, version=K.ONLINE_VERSION, dtypes=FLOATS,
                configs=online_configs, default_config=online_default, bucket=bucket,
                description="one program per row over column blocks (running max and sum), "
                            "then a second pass that writes; any cols"),
        Variant("torch_eager", eager_run, kind="vendor", devices=("cuda",), dtypes=FLOATS, bucket=bucket,
                description="torch's own softmax kernel"),
        Variant("reference", reference_run, kind="reference", devices=("cpu", "cuda"),
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
def _register_op(name: str) -> Op:
    backward = name in BACKWARD
    if backward:
        op = Op(
            name=name,
            reference=REFERENCE[name],
            tensors=lambda g, y, dim=-1: (g, y),
            memo_key=lambda g, y, dim=-1: (g.dtype, g.shape, g.stride(), y.stride(), y.dtype, g.device, dim),
            dtype_key=lambda g, y, dim=-1: f"{g.dtype}".replace("torch.", ""),
            variants=_make_variants(name),
            validate=functools.partial(validate_backward, name),
            samples=functools.partial(sample_inputs, name),
            doc=f"gradient of {name[:-len('_backward')]} from its output",
        )
    else:
        op = Op(
            name=name,
            reference=REFERENCE[name],
            tensors=lambda x, dim=-1: (x,),
            memo_key=lambda x, dim=-1: (x.dtype, x.shape, x.stride(), x.device, dim),
            dtype_key=lambda x, dim=-1: f"{x.dtype}".replace("torch.", ""),
            variants=_make_variants(name),
            validate=functools.partial(validate, name),
            samples=functools.partial(sample_inputs, name),
            doc=f"{name} over one dim",
        )
    return registry.register(op)


OPS = {name: _register_op(name) for name in FORWARD + BACKWARD}


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

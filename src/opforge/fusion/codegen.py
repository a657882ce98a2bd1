"""DAG -> Triton source text.

One program becomes one module with two kernels, the same two memory-access
strategies as the elementwise family (``kernels/elementwise.py``):

* ``fused_flat``: every tensor (inputs and outputs) dense with one shared
  layout; one 1-D range, ``BLOCK`` consecutive elements per program, 16-byte
  vector loads and stores.
* ``fused_strided``: any strides, broadcasting as stride 0, over the index
  space collapsed to 4 dims (``kernels.elementwise.collapse``); a program
  owns a ``BLOCK_R x BLOCK_C`` tile of the last two dims, so addressing is
  two multiply-adds per operand and a unit-stride axis is coalesced.

Values live in registers in their compute dtype: fp32 for 16-bit floats and
fp32, fp64 for fp64, the integer dtype itself for ints (so they wrap as
torch's do), int1 for bool. Every operand is converted explicitly to the
dtype the primitive computes in (torch's promoted dtype), so Triton's own
promotion rules never decide anything. Rounding to a 16-bit float happens at
explicit casts (``.to(torch.bfloat16)`` inside the expression) and at the
store -- not after every intermediate as in eager: fusing skips intermediate
rounding exactly as torch.compile does, so a fused result is at least as
accurate as eager, and the two agree within a rounding per intermediate.

Python-number arguments are kernel arguments (``do_not_specialize``, so a
new value never recompiles). Triton passes a Python float as fp32; in a
program that computes in fp64 they are passed as their IEEE bits (int64)
and bitcast, so fp64 expressions see the full double. Constants written in
the function are module-level ``constexpr`` globals.

Offsets are int32 unless ``INT64`` (a constexpr the launch sets when any
operand reaches 2**31 elements or bytes of reach).
"""

from __future__ import annotations

import torch

from opforge.fusion.expr import Node, Program

COMPUTE = {
    torch.float16: "tl.float32", torch.bfloat16: "tl.float32", torch.float32: "tl.float32",
    torch.float64: "tl.float64", torch.bool: "tl.int1", torch.uint8: "tl.uint8", torch.int8: "tl.int8",
    torch.int16: "tl.int16", torch.int32: "tl.int32", torch.int64: "tl.int64",
}
STORAGE = {torch.float16: "tl.float16", torch.bfloat16: "tl.bfloat16"}
FLOAT_CT = ("tl.float32", "tl.float64")
HELPERS = ("_div", "_rsqrt", "_log1p", "_expm1", "_pow", "_relu", "_sign", "_gelu", "_gelu_tanh", "_sigmoid",
           "_sqrt", "_tanh", "INF", "NAN", "SQRT1_2", "SQRT2_PI", "INV_SQRT_2PI", "TWO_INV_SQRT_PI")


def uses_fp64(program: Program) -> bool:
    return any(not n.weak and n.dtype == torch.float64 for n in program.order())


def scalar_passing(program: Program) -> list[str]:
    """How each scalar parameter is passed: "float" (fp32), "bits" (the double's
    IEEE bits as int64), "int" or "bool" (as an int)."""
    fp64 = uses_fp64(program)
    out = []
    for sid in program.scalars:
        dt = program.graph.nodes[sid].dtype
        out.append("bits" if dt == torch.float64 and fp64 else
                   "float" if dt == torch.float64 else "bool" if dt == torch.bool else "int")
    return out


class _Emitter:
    def __init__(self, program: Program, where: str):
        self.p = program
        self.g = program.graph
        self.where = where
        self.fp64 = uses_fp64(program)
        self.consts: list[str] = []
        self.body: list[str] = []
        self.block: set[int] = set()

    def ct(self, n: Node) -> str:
        if n.weak:
            if n.dtype == torch.float64:
                return "tl.float64" if self.fp64 else "tl.float32"
            return "tl.int1" if n.dtype == torch.bool else "tl.int64"
        return COMPUTE[n.dtype]

    def val(self, i: int, math: str) -> str:
        """Operand ``i`` converted to the compute dtype ``math``."""
        n = self.g.nodes[i]
        src = self.ct(n)
        if src == math:
            return f"v{i}"
        if math == "tl.int1":
            return f"(v{i} != 0)"
        return f"v{i}.to({math})"

    def promoted(self, ids) -> str:
        metas = []
        for i in ids:
            n = self.g.nodes[i]
            metas.append({torch.float64: 1.5, torch.int64: 3, torch.bool: True}[n.dtype] if n.weak
                         else torch.empty(() if n.dim0 else (1,), dtype=n.dtype, device="meta"))
        if all(not isinstance(m, torch.Tensor) for m in metas):
            dt = torch.result_type(torch.tensor(metas[0]), metas[1])
            return self.ct(Node(-1, "", (), (), torch.float64 if dt.is_floating_point else
                                torch.bool if dt == torch.bool else torch.int64, weak=True))
        if not isinstance(metas[0], torch.Tensor):
            metas = metas[::-1]
        return COMPUTE[torch.result_type(metas[0], metas[1])]

    def emit(self, n: Node, load) -> None:
        ct = self.ct(n)
        v = f"v{n.id}"
        if n.op == "input":
            self.block.add(n.id)
            expr = load(n.value)
            storage = STORAGE.get(n.dtype)
            self.body.append(f"{v} = {expr}" + (f".to({ct})" if storage else ""))
            return
        if n.op == "scalar":
            how = scalar_passing(self.p)[n.value]
            s = f"s{n.value}"
            src = {"bits": f"{s}.to(tl.int64).to(tl.float64, bitcast=True)", "float": s,
                   "int": f"{s}.to(tl.int64)", "bool": f"{s} != 0"}[how]
            self.body.append(f"{v} = tl.full([1], {src}, {ct})")
            return
        if n.op == "const":
            name = f"C{n.id}"
            lit = repr(n.value)
            if isinstance(n.value, float) and lit in ("inf", "-inf", "nan"):
                lit = f"float('{lit}')"
            self.consts.append(f"{name} = tl.constexpr({lit})")
            self.body.append(f"{v} = tl.full([1], {name}, {ct})")
            return
        if any(a in self.block for a in n.args):
            self.block.add(n.id)
        self.body.append(f"{v} = {self.formula(n, ct)}")

    def formula(self, n: Node, ct: str) -> str:
        op, a = n.op, n.args
        isfloat = ct in FLOAT_CT
        if op in ("add", "sub", "mul"):
            sym = {"add": "+", "sub": "-", "mul": "*"}[op]
            if ct == "tl.int1":  # bool arithmetic: torch gives or / xor / and
                sym = {"add": "|", "sub": "^", "mul": "&"}[op]
            return f"{self.val(a[0], ct)} {sym} {self.val(a[1], ct)}"
        if op == "div":
            return f"_div({self.val(a[0], ct)}, {self.val(a[1], ct)})"
        if op == "pow":
            return self.power(n, ct)
        if op in ("eq", "ne", "lt", "le", "gt", "ge"):
            m = self.promoted(a)
            sym = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}[op]
            return f"{self.val(a[0], m)} {sym} {self.val(a[1], m)}"
        if op in ("and", "or", "xor"):
            sym = {"and": "&", "or": "|", "xor": "^"}[op]
            return f"{self.val(a[0], ct)} {sym} {self.val(a[1], ct)}"
        if op == "invert":
            return f"({self.val(a[0], ct)} == 0)" if ct == "tl.int1" else f"~{self.val(a[0], ct)}"
        if op == "where":
            return f"tl.where({self.val(a[0], 'tl.int1')}, {self.val(a[1], ct)}, {self.val(a[2], ct)})"
        if op in ("maximum", "minimum"):
            fn = "tl." + op
            if ct == "tl.int1":
                return f"{self.val(a[0], ct)} {'|' if op == 'maximum' else '&'} {self.val(a[1], ct)}"
            nan = ", propagate_nan=tl.PropagateNan.ALL" if isfloat else ""
            return f"{fn}({self.val(a[0], ct)}, {self.val(a[1], ct)}{nan})"
        if op == "clamp":
            r = self.val(a[0], ct)
            rest = list(a[1:])
            nan = ", propagate_nan=tl.PropagateNan.ALL" if isfloat else ""
            if n.attr("has_lo"):
                r = f"tl.maximum({r}, {self.val(rest.pop(0), ct)}{nan})"
            if n.attr("has_hi"):
                r = f"tl.minimum({r}, {self.val(rest.pop(0), ct)}{nan})"
            return r
        if op == "neg":
            return f"-{self.val(a[0], ct)}"
        if op == "abs":
            return f"tl.abs({self.val(a[0], ct)})"
        if op == "sign":
            return f"_sign({self.val(a[0], ct)}).to({ct})"
        if op == "relu":
            return f"_relu({self.val(a[0], ct)}).to({ct})"
        if op == "cast":
            src = self.val(a[0], self.ct(self.g.nodes[a[0]]))
            target = n.attr("dtype")
            if target == torch.bool:
                return f"({src} != 0)"
            if target in STORAGE:
                return f"{src}.to({STORAGE[target]}).to({ct})"
            return f"{src}.to({ct})"
        unary = {"exp": "tl.exp", "log": "tl.log", "log1p": "_log1p", "expm1": "_expm1", "sqrt": "_sqrt",
                 "rsqrt": "_rsqrt", "sigmoid": "_sigmoid", "tanh": "_tanh", "erf": "tl.erf"}
        if op in unary:
            return f"{unary[op]}({self.val(a[0], ct)})"
        if op == "silu":
            x = self.val(a[0], ct)
            return f"{x} * _sigmoid({x})"
        if op == "gelu":
            fn = "_gelu_tanh" if n.attr("approximate") == "tanh" else "_gelu"
            return f"{fn}({self.val(a[0], ct)})"
        raise TypeError(f"{self.where}: no code generator for {op}")

    def power(self, n: Node, ct: str) -> str:
        base, expo = n.args
        e = self.g.nodes[expo]
        x = self.val(base, ct)
        if e.op == "const":
            k = e.value
            if k == 0:
                return f"tl.where({x} == {x}, 1, 1).to({ct})"
            if k == 1:
                return x
            if k == 2:
                return f"{x} * {x}"
            if k == 3:
                return f"{x} * {x} * {x}"
            if ct in FLOAT_CT and k == int(k) and 4 <= abs(k) <= 64:
                # Integer powers by squaring: as accurate as pow, and no exp2/log2.
                prod = self.squaring(n.id, x, int(abs(k)))
                return prod if k > 0 else f"_div(tl.where({x} == {x}, 1.0, 1.0).to({ct}), {prod})"
            if ct in FLOAT_CT:
                if k == 0.5:
                    return f"_sqrt({x})"
                if k == -1:
                    return f"_div(tl.where({x} == {x}, 1.0, 1.0).to({ct}), {x})"
                if k == -0.5:
                    return f"_rsqrt({x})"
            elif isinstance(k, int) and 0 < k <= 64:
                return self.squaring(n.id, x, k)  # wraps as torch's integer pow does
        if ct not in FLOAT_CT:
            raise TypeError(f"{self.where}: an integer power needs a constant exponent between 0 and 64")
        return f"_pow({x}, {self.val(expo, ct)})"


    def squaring(self, nid: int, x: str, k: int) -> str:
        """``x ** k`` for an int ``k >= 1`` by repeated squaring (temporaries in the body)."""
        terms, sq, step = [], x, 0
        while k:
            if k & 1:
                terms.append(sq)
            k >>= 1
            if k:
                step += 1
                self.body.append(f"p{nid}_{step} = {sq} * {sq}")
                sq = f"p{nid}_{step}"
        return " * ".join(terms)


def _arg_names(program: Program) -> tuple[list[str], list[str], list[str]]:
    ins = [f"in{k}" for k in range(len(program.inputs))]
    scs = [f"s{k}" for k in range(len(program.scalars))]
    outs = [f"out{k}" for k in range(len(program.outputs))]
    return ins, scs, outs


def _body(program: Program, load, indent: str, where: str) -> tuple[list[str], list[str]]:
    em = _Emitter(program, where)
    used_inputs = set()
    for n in program.order():
        if n.op == "input":
            used_inputs.add(n.value)
        em.emit(n, load)
    lines = list(em.body)
    for k, nid in enumerate(program.outputs):
        v = f"v{nid}"
        if nid not in em.block:  # an output that does not read a tensor: broadcast it
            v = f"tl.where(mask, {v}, {v})"
        lines.append(f"STORE({k}, {v}.to(out{k}.dtype.element_ty))")
    return [indent + ln for ln in lines], em.consts


def generate(program: Program, where: str = "opforge.fuse") -> str:
    """The module source: ``fused_flat`` and ``fused_strided`` for ``program``."""
    ins, scs, outs = _arg_names(program)
    dns = f"do_not_specialize={scs!r}" if scs else ""

    flat_body, consts = _body(program, lambda k: f"tl.load(in{k} + offs, mask=mask)", "    ", where)
    flat_body = [_fix_store(ln, "offs") for ln in flat_body]

    strided_offsets = []
    for name in ins + outs:
        strided_offsets.append(f"    {name}_off = i0 * {name}_s0 + i1 * {name}_s1 + rows[:, None] * {name}_s2 "
                               f"+ cols[None, :] * {name}_s3")
    strided_body, _ = _body(program, lambda k: f"tl.load(in{k} + in{k}_off, mask=mask)", "    ", where)
    strided_body = [_fix_store(ln, None) for ln in strided_body]

    strides = ", ".join(f"{name}_s{d}" for name in ins + outs for d in range(4))
    head = ", ".join(ins + scs + outs)
    src = [
        f'"""Generated by opforge.fuse for {program.name}. Do not edit: the file name is a hash of this text."""',
        "import triton",
        "import triton.language as tl",
        "from opforge.fusion.device_fns import " + ", ".join(HELPERS),
        "",
        *consts,
        "",
        "",
        f"@triton.jit({dns})",
        f"def fused_flat({head}, n, BLOCK: tl.constexpr, INT64: tl.constexpr):",
        "    pid = tl.program_id(0)",
        "    if INT64:",
        "        offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)",
        "    else:",
        "        offs = pid * BLOCK + tl.arange(0, BLOCK)",
        "    mask = offs < n",
        *flat_body,
        "",
        "",
        f"@triton.jit({dns})",
        f"def fused_strided({head}, D1, D2, D3, {strides},",
        "                  BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, INT64: tl.constexpr):",
        "    # Column tiles fastest, so neighbouring programs touch neighbouring memory.",
        "    pid = tl.program_id(0)",
        "    tiles_c = tl.cdiv(D3, BLOCK_C)",
        "    tiles_r = tl.cdiv(D2, BLOCK_R)",
        "    pid_c = pid % tiles_c",
        "    t = pid // tiles_c",
        "    tile_r = t % tiles_r",
        "    rest = t // tiles_r",
        "    i1 = rest % D1",
        "    i0 = rest // D1",
        "    rows = tile_r * BLOCK_R + tl.arange(0, BLOCK_R)",
        "    cols = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)",
        "    if INT64:",
        "        i0 = i0.to(tl.int64)",
        "        i1 = i1.to(tl.int64)",
        "        rows = rows.to(tl.int64)",
        "        cols = cols.to(tl.int64)",
        "    mask = (rows[:, None] < D2) & (cols[None, :] < D3)",
        *strided_offsets,
        *strided_body,
        "",
    ]
    return "\n".join(src)


def _fix_store(line: str, flat_offs: str | None) -> str:
    """``STORE(k, value)`` -> the store of output ``k`` with this kernel's offsets."""
    i = line.find("STORE(")
    if i < 0:
        return line
    k, value = line[i + len("STORE("):-1].split(", ", 1)
    off = flat_offs if flat_offs else f"out{k}_off"
    return f"{line[:i]}tl.store(out{k} + {off}, {value}, mask=mask)"

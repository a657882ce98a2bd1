"""Bound scalar expressions and their vectorized evaluation over Columns with SQL NULL semantics.

Columns are referenced by a globally unique id (cid), so an expression can be evaluated on any batch that
holds those ids: the optimizer moves expressions between operators without renumbering."""
from __future__ import annotations

import datetime
import re
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import torch

from opforge.sql import dates, strings
from opforge.sql import types as T
from opforge.sql.column import (
    ARROW_MIN_WORDS, Column, arrow_dictionary, code_bound, map_dictionary, map_dictionary_arrow, storage_value,
    unify_strings,
)
from opforge.sql.errors import NotSupportedError, SqlError


class Batch:
    """Whole-column batch flowing between operators: cid -> Column, all of length n.
    ``hash_keys``: in the simulated multi-worker mode, the columns whose hash places every row on
    its worker (``physical/distributed.py``); empty otherwise."""

    hash_keys: frozenset = frozenset()

    def __init__(self, cols: dict[int, Column], n: int, device):
        self.cols, self.n, self.device = cols, n, device

    def take(self, idx: torch.Tensor) -> "Batch":
        return Batch({k: c.take(idx) for k, c in self.cols.items()}, int(idx.shape[0]), self.device)


class Expr:
    type: T.SqlType

    def children(self) -> list["Expr"]:
        return []

    def cids(self) -> set[int]:
        out: set[int] = set()
        for c in self.children():
            out |= c.cids()
        return out


@dataclass(eq=False)
class Ref(Expr):
    cid: int
    type: T.SqlType
    name: str = ""

    def cids(self):
        return {self.cid}

    def __str__(self):
        return f"{self.name}#{self.cid}"


@dataclass(eq=False)
class Lit(Expr):
    value: object
    type: T.SqlType

    def __str__(self):
        if self.value is None:
            return "NULL"
        if self.type.kind == "DATE":
            return f"DATE '{datetime.date(1970, 1, 1) + datetime.timedelta(days=int(self.value))}'"
        if self.type.kind == "DECIMAL":
            return str(self.value)
        return repr(self.value)


@dataclass(eq=False)
class Func(Expr):
    name: str
    args: list[Expr]
    type: T.SqlType
    extra: object = None

    def children(self):
        return self.args

    def __str__(self):
        a = self.args
        if self.name in ("arith", "cmp"):
            return f"({a[0]} {self.extra} {a[1]})"
        if self.name in ("and", "or"):
            return f"({a[0]} {self.name.upper()} {a[1]})"
        if self.name == "not":
            return f"NOT {a[0]}"
        if self.name == "is_null":
            return f"{a[0]} IS NULL"
        inner = ", ".join(str(x) for x in a)
        return f"{self.name}({inner}{'' if self.extra is None else ', ' + repr(self.extra)})"


def is_const(e: Expr) -> bool:
    return isinstance(e, Lit) or (isinstance(e, Func) and all(is_const(a) for a in e.args))


# ---------------------------------------------------------------------------------------------- typing
def _int_digits(t: T.SqlType) -> int:
    return {"INT32": 10, "INT64": 19, "BOOL": 1}[t.kind]


def _as_decimal_type(t: T.SqlType, lit: Expr | None = None) -> T.SqlType:
    if t.kind == "DECIMAL":
        return t
    return T.decimal(_int_digits(t), 0)


def arith_type(op: str, a: Expr, b: Expr) -> T.SqlType:
    ta, tb = a.type, b.type
    where = f"operator {op}"
    if ta.kind == "DATE" or tb.kind == "DATE":
        if op == "-" and ta.kind == "DATE" and tb.kind == "DATE":
            return T.INT64
        if op in "+-" and ta.kind == "DATE" and tb.is_integer:
            return T.DATE
        if op == "+" and tb.kind == "DATE" and ta.is_integer:
            return T.DATE
        raise SqlError(f"{where}: cannot apply to {ta} and {tb}")
    if not (ta.is_numeric and tb.is_numeric):
        raise SqlError(f"{where}: expected numeric operands, got {ta} and {tb}")
    if op == "/":
        return T.FLOAT64
    if ta.is_float or tb.is_float:
        return T.FLOAT32 if ta.kind == tb.kind == "FLOAT32" else T.FLOAT64
    if ta.kind == "DECIMAL" or tb.kind == "DECIMAL":
        if op == "//":
            raise NotSupportedError("integer division // of DECIMAL values")
        da, db = _as_decimal_type(ta, a), _as_decimal_type(tb, b)
        if op == "*":
            p = da.precision + db.precision
            return T.decimal(min(p, 18) if da.precision <= 18 and db.precision <= 18 else p, da.scale + db.scale)
        s = max(da.scale, db.scale)
        return T.decimal(max(da.precision - da.scale, db.precision - db.scale) + s + (1 if op in "+-" else 0), s)
    return T.INT32 if ta.kind in ("INT32", "BOOL") and tb.kind in ("INT32", "BOOL") else T.INT64


# ----------------------------------------------------------------------------------------- evaluation
def evaluate(e: Expr, batch: Batch) -> Column:
    if isinstance(e, Ref):
        col = batch.cols.get(e.cid)
        if col is None:
            raise SqlError(f"internal: column {e} is not available here")
        return col
    if isinstance(e, Lit):
        return Column.constant(e.value, e.type, batch.n, batch.device)
    if e.name in _LITERAL_PATHS:  # an operand that is a literal stays a Python value
        out = _LITERAL_PATHS[e.name](e, batch)
        if out is not None:
            return out
    fn = _FUNCS.get(e.name)
    if fn is None:
        raise NotSupportedError(f"function {e.name}")
    return fn(e, [evaluate(a, batch) for a in e.args], batch)


def _and_valid(*cols: Column) -> torch.Tensor | None:
    masks = [c.valid for c in cols if c.valid is not None]
    if not masks:
        return None
    out = masks[0]
    for m in masks[1:]:
        out = out & m
    return out


def _scale_up(v: torch.Tensor, k: int) -> torch.Tensor:
    if k <= 0:
        return v
    if v.numel() and bool((v.abs() > (2 ** 62) // (10 ** k)).any()):
        raise SqlError(f"overflow: rescaling a DECIMAL by 10^{k} exceeds its int64 storage")
    return v * (10 ** k)


def _round_div(v: torch.Tensor, factor: int) -> torch.Tensor:
    """Integer division rounding half away from zero (DuckDB's decimal rescale)."""
    if factor == 1:
        return v
    q = torch.div(v.abs() + factor // 2, factor, rounding_mode="floor")
    return torch.where(v < 0, -q, q)


def cast_values(col: Column, to: T.SqlType) -> torch.Tensor:
    """The values of `col` converted to `to`'s storage (NULL slots carry arbitrary values)."""
    fr = col.type
    v = col.values
    if fr == to:
        return v
    if to.kind == "DECIMAL":
        if fr.kind == "DECIMAL":
            if to.scale >= fr.scale:
                return _scale_up(v, to.scale - fr.scale)
            return _round_div(v, 10 ** (fr.scale - to.scale))
        if fr.is_float:
            x = v.double() * (10 ** to.scale)
            return (torch.sign(x) * torch.floor(x.abs() + 0.5)).long()  # half away from zero
        return _scale_up(v.long(), to.scale)
    if to.is_float:
        if fr.kind == "DECIMAL":
            return (v.double() / (10 ** fr.scale)).to(to.torch_dtype)
        return v.to(to.torch_dtype)
    if to.is_integer or to.kind == "BOOL":
        if fr.kind == "DECIMAL":
            v = _round_div(v, 10 ** fr.scale)
        elif fr.is_float and to.kind != "BOOL":
            v = torch.sign(v) * torch.floor(v.abs() + 0.5)
        return (v != 0) if to.kind == "BOOL" else v.to(to.torch_dtype)
    if to.kind == "DATE" and fr.kind == "DATE":
        return v
    raise NotSupportedError(f"CAST from {fr} to {to}")


def _arith(e: Func, args, batch):
    a, b = args
    op = e.extra
    valid = _and_valid(a, b)
    t = e.type
    if t.kind == "DATE" or (a.type.kind == "DATE" and b.type.kind == "DATE"):
        av, bv = a.values.long(), b.values.long()
        out = av + bv if op == "+" else av - bv
        return Column(out.to(t.torch_dtype), valid, t)
    if op == "/":  # DOUBLE division, IEEE results for a zero divisor (as DuckDB)
        return Column(cast_values(a, T.FLOAT64) / cast_values(b, T.FLOAT64), valid, t)
    if t.kind == "DECIMAL" and op == "*":
        da, db = _as_decimal_type(a.type), _as_decimal_type(b.type)
        av = cast_values(a, T.decimal(18, da.scale))
        bv = cast_values(b, T.decimal(18, db.scale))
        return Column(_checked("*", av, bv, t, valid), valid, t)
    work = t if t.kind != "DECIMAL" else T.decimal(18, t.scale)
    av, bv = cast_values(a, work), cast_values(b, work)
    if op in "+-*":
        out = _checked(op, av, bv, t, valid)
    elif op in ("//", "%"):
        if t.is_float:
            out = torch.div(av, bv, rounding_mode="floor") if op == "//" else torch.fmod(av, bv)
        else:
            zero = bv == 0
            if valid is not None:
                zero = zero & valid
            if bool(zero.any()):  # DuckDB raises too
                raise SqlError(f"division by zero in {op}")
            safe = torch.where(bv == 0, torch.ones_like(bv), bv)
            # truncating division; the remainder takes the dividend's sign (C, DuckDB)
            out = torch.div(av, safe, rounding_mode="trunc") if op == "//" else torch.fmod(av, safe)
    else:
        raise NotSupportedError(f"operator {op}")
    return Column(out.to(t.torch_dtype), valid, t)


_INT64_SAFE = 2.0 ** 62


def _arith_literal(e: Func, batch) -> Column | None:
    """``x + - * literal`` (either side) with a BIGINT or DECIMAL result and the literal kept a Python
    int: no column of copies and no overflow check of copies (TPC-H's ``1 - l_discount``). The same
    values, scales and overflow checks as ``_arith``. None: not this case (the general path)."""
    a, b = e.args
    op, t = e.extra, e.type
    if op not in ("+", "-", "*") or t.kind not in ("DECIMAL", "INT64"):
        return None
    lit_left = isinstance(a, Lit) and not isinstance(b, Lit)
    x, lit = (b, a) if lit_left else (a, b)
    if not isinstance(lit, Lit) or isinstance(x, Lit) or lit.value is None:
        return None
    if "BOOL" in (x.type.kind, lit.type.kind):
        return None
    sx, sl = _scale_of(x.type), _scale_of(lit.type)
    value = storage_value(lit.value, lit.type) if sl is not None else None
    if sx is None or isinstance(value, bool) or not isinstance(value, int):
        return None
    ts = t.scale if t.kind == "DECIMAL" else 0
    col = evaluate(x, batch)
    v = col.values.long()
    if op == "*":
        if ts != sx + sl:
            return None
    else:
        if ts < max(sx, sl):
            return None
        v = _scale_up(v, ts - sx)
        value *= 10 ** (ts - sl)
    if abs(value) >= 2 ** 63:
        return None
    if op == "+":
        out = v + value
    elif op == "*":
        out = v * value
    else:
        out = value - v if lit_left else v - value
    if t.kind == "INT64" or t.precision > 18:  # _checked's estimate, with the literal as a float
        est = {"+": v.double() + float(value), "*": v.double() * float(value),
               "-": (float(value) - v.double()) if lit_left else (v.double() - float(value))}[op].abs()
        if col.valid is not None:
            est = torch.where(col.valid, est, torch.zeros_like(est))
        if len(est) and bool((est > _INT64_SAFE).any()):
            raise SqlError(f"overflow in {t} {op}: the result exceeds the int64 storage range")
    return Column(out.to(t.torch_dtype), col.valid, t)


def _checked(op: str, av: torch.Tensor, bv: torch.Tensor, t: T.SqlType, valid) -> torch.Tensor:
    """+ - * that raise instead of wrapping around (DuckDB raises an out-of-range error too).
    INT32 results are computed in int64 and range-checked exactly; int64 storage (BIGINT, wide
    DECIMAL) is checked against a float64 estimate."""
    fn = {"+": torch.add, "-": torch.sub, "*": torch.mul}[op]
    if t.kind == "INT32":
        wide = fn(av.long(), bv.long())
        bad = (wide < -2**31) | (wide >= 2**31)
        if valid is not None:
            bad &= valid
        if bool(bad.any()):
            raise SqlError(f"overflow in INT32 {op}")
        return wide.to(torch.int32)
    out = fn(av, bv)
    if out.dtype == torch.int64 and (t.kind == "INT64" or (t.kind == "DECIMAL" and t.precision > 18)):
        est = fn(av.double(), bv.double()).abs()
        if valid is not None:
            est = torch.where(valid, est, torch.zeros_like(est))
        if len(est) and bool((est > _INT64_SAFE).any()):
            raise SqlError(f"overflow in {t} {op}: the result exceeds the int64 storage range")
    return out


def _merge(valid, extra):
    return extra if valid is None else valid & extra


def _neg(e, args, batch):
    (a,) = args
    return Column(-a.values, a.valid, a.type)


def comparable(a: Column, b: Column) -> tuple[torch.Tensor, torch.Tensor]:
    """Both columns as tensors of one type whose order is SQL order."""
    if a.type.kind == "STRING" or b.type.kind == "STRING":
        if a.type.kind != b.type.kind:
            raise SqlError(f"cannot compare {a.type} with {b.type}")
        a, b = unify_strings([a, b])
        return a.values, b.values
    if a.type.kind == "DATE" or b.type.kind == "DATE":
        if a.type.kind != b.type.kind:
            raise SqlError(f"cannot compare {a.type} with {b.type}")
        return a.values, b.values
    t = T.common_numeric(a.type, b.type)
    if t.kind == "DECIMAL":
        t = T.decimal(18, t.scale)
    return cast_values(a, t), cast_values(b, t)


def _is_constant_string(c: Column) -> bool:
    """A one-word dictionary without NULLs: every row holds that word (literals evaluate to this)."""
    return c.dictionary is not None and len(c.dictionary) == 1 and c.valid is None


_CMP = {"=": torch.eq, "<>": torch.ne, "<": torch.lt, "<=": torch.le, ">": torch.gt, ">=": torch.ge}


def _compare(e, args, batch):
    a, b = args
    flip = {"=": "=", "<>": "<>", "<": ">", "<=": ">=", ">": "<", ">=": "<="}
    op = e.extra
    if a.type.kind == "STRING" and b.type.kind == "STRING" and _is_constant_string(a) and not _is_constant_string(b):
        a, b, op = b, a, flip[op]
    if a.type.kind == "STRING" and b.type.kind == "STRING" and _is_constant_string(b):
        # column vs one string: compare codes against that string's position, no re-coding of the column
        w = b.dictionary[0]
        lo, hi = code_bound(a.dictionary, w, "left"), code_bound(a.dictionary, w, "right")
        c = a.values
        out = {"=": (c >= lo) & (c < hi), "<>": (c < lo) | (c >= hi), "<": c < lo, "<=": c < hi,
               ">": c >= hi, ">=": c >= lo}[op]
        return Column(out, a.valid, T.BOOL)
    if _decimal_scales_differ(a.type, b.type):
        return Column(_compare_scaled(op, a, b), _and_valid(a, b), T.BOOL)
    av, bv = comparable(a, b)
    return Column(_CMP[op](av, bv), _and_valid(a, b), T.BOOL)


_FLIP_CMP = {"=": "=", "<>": "<>", "<": ">", "<=": ">=", ">": "<", ">=": "<="}


def _literal_at_scale(col_type: T.SqlType, lit: Lit) -> tuple[int, bool] | None:
    """A non-NULL integer / DECIMAL / DATE literal as ``(floor(L / f), exact)`` at the column's scale:
    the column stores ``x`` at scale s, the literal ``L`` at scale t; ``f = 10^(t - s)`` when t > s
    (``exact``: f divides L), else the literal is scaled up exactly. None: not such a pair."""
    tb = lit.type
    if col_type.kind == "DATE" and tb.kind == "DATE":
        sa = sb = 0
    elif "BOOL" in (col_type.kind, tb.kind) or "DATE" in (col_type.kind, tb.kind):
        return None
    else:
        sa, sb = _scale_of(col_type), _scale_of(tb)
        if sa is None or sb is None:
            return None
    value = storage_value(lit.value, tb)
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    if sb <= sa:
        return value * 10 ** (sa - sb), True
    f = 10 ** (sb - sa)
    return value // f, value % f == 0


def _filled(value: bool, col: Column, batch) -> Column:
    fill = torch.ones if value else torch.zeros
    return Column(fill(batch.n, dtype=torch.bool, device=batch.device), col.valid, T.BOOL)


def _compare_literal(e, batch) -> Column | None:
    """``x <op> literal`` over integers, DECIMALs and DATEs, exactly, with the literal kept a Python
    int: no column of copies, and a DECIMAL literal of a finer scale is moved to the column's scale
    instead of splitting the column (``_literal_at_scale``: x < L / f iff x < ceil(L / f); x = L / f
    only when f divides L). None: not this case (the general path)."""
    a, b = e.args
    op = e.extra
    if isinstance(a, Lit) and not isinstance(b, Lit):
        a, b, op = b, a, _FLIP_CMP[op]
    if not isinstance(b, Lit) or isinstance(a, Lit) or b.value is None or op not in _FLIP_CMP:
        return None
    scaled = _literal_at_scale(a.type, b)
    if scaled is None:
        return None
    bound, exact = scaled
    col = evaluate(a, batch)
    if not exact:  # bound = floor(L / f) < L / f < bound + 1
        if op in ("=", "<>"):
            return _filled(op == "<>", col, batch)
        op = {"<": "<=", ">=": ">"}.get(op, op)
    info = torch.iinfo(col.values.dtype)
    if not info.min <= bound <= info.max:  # every value of the column lies on one side of it
        below = bound < info.min
        return _filled({"=": False, "<>": True, "<": not below, "<=": not below, ">": below, ">=": below}[op],
                       col, batch)
    return Column(_CMP[op](col.values, bound), col.valid, T.BOOL)


def _in_literals(e, batch) -> Column | None:
    """``x [NOT] IN (literal, ...)`` in one pass: a string column's matching dictionary codes as a
    lookup table, a number's or date's listed values (at its scale; inexact ones never match) by
    ``isin``. SQL's NULLs: a NULL x, or no match with a NULL in the list, is NULL. None: another case."""
    x, items = e.args[0], e.args[1:]
    if not items or not all(isinstance(i, Lit) for i in items) or isinstance(x, Lit):
        return None
    listed = [i for i in items if i.value is not None]
    has_null = len(listed) < len(items)
    if x.type.kind == "STRING":
        if not all(i.type.kind == "STRING" for i in listed):
            return None
        col = evaluate(x, batch)
        table = torch.zeros(len(col.dictionary) + 1, dtype=torch.bool)
        for i in listed:
            table[code_bound(col.dictionary, i.value, "left"):code_bound(col.dictionary, i.value, "right")] = True
        hit = table.to(col.device)[col.values.long()]
    else:
        scaled = [_literal_at_scale(x.type, i) for i in listed]
        if any(v is None for v in scaled):
            return None
        col = evaluate(x, batch)
        info = torch.iinfo(col.values.dtype)
        values = [v for v, exact in scaled if exact and info.min <= v <= info.max]
        hit = torch.isin(col.values, torch.tensor(values, dtype=col.values.dtype, device=col.device))
    valid = col.valid
    if has_null:
        valid = hit if valid is None else valid & hit  # no match against a NULL: NULL
    return Column(~hit if e.extra else hit, valid, T.BOOL)


def _scale_of(t: T.SqlType) -> int | None:
    if t.kind == "DECIMAL":
        return t.scale
    return 0 if t.kind in ("INT32", "INT64", "BOOL") else None


def _decimal_scales_differ(ta: T.SqlType, tb: T.SqlType) -> bool:
    sa, sb = _scale_of(ta), _scale_of(tb)
    return "DECIMAL" in (ta.kind, tb.kind) and sa is not None and sb is not None and sa != sb


def _compare_scaled(op: str, a: Column, b: Column) -> torch.Tensor:
    """Exact comparison of scaled integers without rescaling up (which can overflow int64): the side
    with more decimals is split into (quotient, remainder) at the other side's scale."""
    sa, sb = _scale_of(a.type), _scale_of(b.type)
    s = min(sa, sb)

    def split(col, sc):
        v = col.values.long()
        if sc == s:
            return v, torch.zeros_like(v)
        f = 10 ** (sc - s)
        return torch.div(v, f, rounding_mode="floor"), torch.remainder(v, f)
    qa, ra = split(a, sa)
    qb, rb = split(b, sb)
    lt = (qa < qb) | ((qa == qb) & (ra < rb))
    eq = (qa == qb) & (ra == rb)
    return {"=": eq, "<>": ~eq, "<": lt, "<=": lt | eq, ">": ~(lt | eq), ">=": ~lt}[op]


def _and(e, args, batch):
    a, b = args
    if a.valid is None and b.valid is None:
        return Column(a.values & b.values, None, T.BOOL)
    av, bv = a.values & a.valid_mask(), b.values & b.valid_mask()
    a_false = a.valid_mask() & ~a.values
    b_false = b.valid_mask() & ~b.values
    valid = (a.valid_mask() & b.valid_mask()) | a_false | b_false
    return Column(av & bv, valid, T.BOOL)


def _or(e, args, batch):
    a, b = args
    if a.valid is None and b.valid is None:
        return Column(a.values | b.values, None, T.BOOL)
    a_true = a.valid_mask() & a.values
    b_true = b.valid_mask() & b.values
    valid = (a.valid_mask() & b.valid_mask()) | a_true | b_true
    return Column(a_true | b_true, valid, T.BOOL)


def _not(e, args, batch):
    (a,) = args
    return Column(~a.values, a.valid, T.BOOL)


def _is_null(e, args, batch):
    (a,) = args
    return Column(a.null_mask(), None, T.BOOL)


def _coerce(col: Column, t: T.SqlType) -> Column:
    """A column cast to `t` (strings keep their own dictionaries; callers unify)."""
    if col.type == t or t.kind == "STRING":
        return col
    return Column(cast_values(col, t), col.valid, t)


def _choose(conds: list[torch.Tensor], vals: list[Column], default: Column, t: T.SqlType) -> Column:
    """CASE core: first true condition wins, else default."""
    cols = [_coerce(c, t) for c in vals] + [_coerce(default, t)]
    if t.kind == "STRING":
        cols = unify_strings(cols)
    out_v, out_ok = cols[-1].values, cols[-1].valid_mask()
    for cond, c in reversed(list(zip(conds, cols[:-1]))):
        out_v = torch.where(cond, c.values, out_v)
        out_ok = torch.where(cond, c.valid_mask(), out_ok)
    return Column(out_v, None if bool(out_ok.all()) else out_ok, t, cols[-1].dictionary)


def _case(e, args, batch):
    # args: cond1, val1, cond2, val2, ..., else
    pairs = len(args) // 2
    conds = [args[2 * i].values & args[2 * i].valid_mask() for i in range(pairs)]
    vals = [args[2 * i + 1] for i in range(pairs)]
    return _choose(conds, vals, args[-1], e.type)


def _coalesce(e, args, batch):
    conds = [a.valid_mask() for a in args[:-1]]
    return _choose(conds, args[:-1], args[-1], e.type)


def _nullif(e, args, batch):
    a, b = args
    eq = _compare(Func("=", e.args, T.BOOL, "="), [a, b], batch)
    kill = eq.values & eq.valid_mask()
    return Column(a.values, a.valid_mask() & ~kill, a.type, a.dictionary)


def _cast(e, args, batch):
    (a,) = args
    return Column(cast_values(a, e.type), a.valid, e.type, a.dictionary if e.type.kind == "STRING" else None)


def _in_list(e, args, batch):
    a, items = args[0], args[1:]
    hit = torch.zeros(batch.n, dtype=torch.bool, device=batch.device)
    any_null = torch.zeros(batch.n, dtype=torch.bool, device=batch.device)
    for it in items:
        eq = _compare(Func("=", [], T.BOOL, "="), [a, it], batch)
        hit |= eq.values & eq.valid_mask()
        any_null |= ~eq.valid_mask()
    valid = hit | ~any_null
    if e.extra:  # NOT IN
        return Column(~hit, None if bool(valid.all()) else valid, T.BOOL)
    return Column(hit, None if bool(valid.all()) else valid, T.BOOL)


def like_regex(pattern: str) -> re.Pattern:
    out = []
    for ch in pattern:
        out.append(".*" if ch == "%" else "." if ch == "_" else re.escape(ch))
    return re.compile("".join(out), re.DOTALL)


def device_like(col: Column) -> bool:
    """LIKE over the dictionary's bytes on the device (``sql/strings.py``) on GPUs; on the CPU
    Arrow's kernel over the host dictionary is faster."""
    return col.device.type == "cuda"


def _like(e, args, batch):
    (a,) = args
    pattern = e.extra[0]
    large = len(a.dictionary or ()) >= ARROW_MIN_WORDS
    if large and device_like(a):
        dw = strings.device_words(a.dictionary, arrow_dictionary(a.dictionary), a.device)
        if strings.supports(dw, pattern):
            m = strings.like(dw, pattern)[a.values.long()]
            return Column(~m if e.extra[1] else m, a.valid, T.BOOL)
    if large and "\\" not in pattern:  # Arrow's LIKE escapes with \
        m = map_dictionary_arrow(a, lambda words: pc.match_like(words, pattern), T.BOOL)
    else:
        rx = like_regex(pattern)
        m = map_dictionary(a, lambda s: rx.fullmatch(s) is not None, T.BOOL)
    return Column(~m.values if e.extra[1] else m.values, a.valid, T.BOOL)


def _arrow_substring(words: pa.Array, extra) -> pa.Array | None:
    """SUBSTRING over ASCII words with a positive start (Arrow slices code units), else None."""
    start, length = extra
    if start < 1 or (length is not None and length < 0) or not pc.all(pc.string_is_ascii(words)).as_py():
        return None
    stop = None if length is None else start - 1 + length
    return pc.utf8_slice_codeunits(words, start - 1, stop)


def _string_fn(fn, arrow_fn=None):
    def run(e, args, batch):
        (a,) = args
        if arrow_fn is not None and len(a.dictionary or ()) >= ARROW_MIN_WORDS:
            out = arrow_fn(arrow_dictionary(a.dictionary), e.extra)
            if out is not None:
                return map_dictionary_arrow(a, lambda _: out, e.type)
        return map_dictionary(a, lambda s: fn(s, e.extra), e.type)
    return run


def _substring_run(e, args, batch):
    """SUBSTRING: over a large dictionary on the GPU from its bytes there when the slice is short
    (``strings.short_substring``), else per distinct word (Arrow, or Python)."""
    (a,) = args
    start, length = e.extra
    if len(a.dictionary or ()) >= ARROW_MIN_WORDS and device_like(a) and start >= 1 and length is not None:
        dw = strings.device_words(a.dictionary, arrow_dictionary(a.dictionary), a.device)
        out = strings.short_substring(dw, start - 1, length)
        if out is not None:
            table, words = out
            return Column(table[a.values.long()], a.valid, e.type, words)
    return _substring_words(e, args, batch)


def _substring(s: str, extra) -> str:
    start, length = extra
    begin = max(start - 1, 0) if start > 0 else max(len(s) + start, 0) if start < 0 else 0
    if length is None:
        return s[begin:]
    end = start - 1 + length if start > 0 else begin + length
    return s[begin:max(end, begin)]


def _concat(e, args, batch):
    """a || b: strings are built once per distinct (code, code) pair present, then dictionary-encoded."""
    cols = [a if a.type.kind == "STRING" else _to_string(a) for a in args]
    codes = torch.stack([c.values.long() for c in cols], dim=1)
    uniq, inv = torch.unique(codes, dim=0, return_inverse=True)
    host = uniq.cpu().tolist()
    words = ["".join(c.dictionary[k] if c.dictionary else "" for c, k in zip(cols, row)) for row in host]
    merged = tuple(sorted(set(words)))
    pos = {w: i for i, w in enumerate(merged)}
    table = torch.tensor([pos[w] for w in words] or [0], dtype=torch.int32, device=batch.device)
    return Column(table[inv] if batch.n else torch.zeros(0, dtype=torch.int32, device=batch.device),
                  _and_valid(*cols), T.STRING, merged)


def _to_string(col: Column) -> Column:
    uniq, inv = torch.unique(col.values, return_inverse=True)
    if col.type.kind == "DECIMAL":
        words = [str(Column(uniq[i:i + 1], None, col.type).to_arrow()[0].as_py()) for i in range(len(uniq))]
    elif col.type.kind == "DATE":
        words = [str(x) for x in Column(uniq, None, col.type).to_arrow().to_pylist()]
    else:
        words = [str(x) for x in uniq.cpu().tolist()]
    merged = tuple(sorted(set(words)))
    pos = {w: i for i, w in enumerate(merged)}
    table = torch.tensor([pos[w] for w in words] or [0], dtype=torch.int32, device=col.device)
    return Column(table[inv], col.valid, T.STRING, merged)


def _cast_string(e, args, batch):
    return _to_string(args[0])


def _extract(e, args, batch):
    (a,) = args
    return Column(dates.extract(e.extra, a.values), a.valid, T.INT64)


def _add_months(e, args, batch):
    (a,) = args
    return Column(dates.add_months(a.values, e.extra), a.valid, T.DATE)


def _abs(e, args, batch):
    (a,) = args
    return Column(a.values.abs(), a.valid, a.type)


def _round(e, args, batch):
    (a,) = args
    digits = e.extra
    if a.type.kind == "DECIMAL":
        drop = max(a.type.scale - digits, 0)
        return Column(_round_div(a.values, 10 ** drop), a.valid, e.type)
    if a.type.is_float:
        f = 10.0 ** digits
        v = a.values
        return Column(torch.sign(v) * torch.floor(v.abs() * f + 0.5) / f, a.valid, e.type)
    return a


_substring_words = _string_fn(_substring, _arrow_substring)

_LITERAL_PATHS = {"cmp": _compare_literal, "in": _in_literals, "arith": _arith_literal}

_FUNCS = {
    "arith": _arith, "neg": _neg, "cmp": _compare, "and": _and, "or": _or, "not": _not, "is_null": _is_null,
    "case": _case, "coalesce": _coalesce, "nullif": _nullif, "cast": _cast, "in": _in_list, "like": _like,
    "upper": _string_fn(lambda s, _: s.upper()), "lower": _string_fn(lambda s, _: s.lower()),
    "length": _string_fn(lambda s, _: len(s)), "substring": _substring_run, "trim": _string_fn(lambda s, _: s.strip()),
    "concat": _concat, "to_string": _cast_string, "extract": _extract, "add_months": _add_months, "abs": _abs,
    "round": _round,
}


# ------------------------------------------------------------------------------------- constructors
def cmp(op: str, a: Expr, b: Expr) -> Func:
    return Func("cmp", [a, b], T.BOOL, op)


def and_(parts: list[Expr]) -> Expr:
    out = parts[0]
    for p in parts[1:]:
        out = Func("and", [out, p], T.BOOL)
    return out


def conjuncts(e: Expr | None) -> list[Expr]:
    if e is None:
        return []
    if isinstance(e, Func) and e.name == "and":
        return conjuncts(e.args[0]) + conjuncts(e.args[1])
    return [e]


def equi_pair(c: Expr, left: set[int], right: set[int]):
    """(left expr, right expr) when c is `a = b` with a over `left` and b over `right` (either order)."""
    if not (isinstance(c, Func) and c.name == "cmp" and c.extra == "="):
        return None
    a, b = c.args
    ac, bc = a.cids(), b.cids()
    if not ac or not bc:
        return None
    if ac <= left and bc <= right:
        return a, b
    if bc <= left and ac <= right:
        return b, a
    return None


def split_equi(conds: list[Expr], left: set[int], right: set[int]) -> tuple[list[Expr], list[Expr], list[Expr]]:
    """(left keys, right keys, residual): the equalities of ``conds`` between ``left`` and ``right``
    become join keys, in order; every other condition is residual."""
    lk, rk, residual = [], [], []
    for c in conds:
        pair = equi_pair(c, left, right)
        if pair:
            lk.append(pair[0])
            rk.append(pair[1])
        else:
            residual.append(c)
    return lk, rk, residual


def substitute(e: Expr, mapping: dict[int, Expr]) -> Expr:
    """Replace column references by expressions (used when pushing predicates below projections)."""
    if isinstance(e, Ref):
        return mapping.get(e.cid, e)
    if isinstance(e, Func):
        return Func(e.name, [substitute(a, mapping) for a in e.args], e.type, e.extra)
    return e


def fold_constants(e: Expr, device) -> Expr:
    """Evaluate constant sub-expressions once, on one row."""
    if isinstance(e, Func):
        args = [fold_constants(a, device) for a in e.args]
        e = Func(e.name, args, e.type, e.extra)
        if all(isinstance(a, Lit) for a in args) and e.type.kind != "STRING":
            col = evaluate(e, Batch({}, 1, device))
            if col.valid is not None and not bool(col.valid[0]):
                return Lit(None, e.type)
            v = col.values[0].item()
            if e.type.kind == "DECIMAL":
                from decimal import Decimal
                return Lit(Decimal(v).scaleb(-e.type.scale), e.type)
            return Lit(v, e.type) if e.type.kind != "DATE" else Lit(int(v), e.type)
    return e


def disjuncts(e: Expr) -> list[Expr]:
    if isinstance(e, Func) and e.name == "or":
        return disjuncts(e.args[0]) + disjuncts(e.args[1])
    return [e]


def factor_or(e: Expr) -> list[Expr]:
    """(a AND b) OR (a AND c) -> [a, b OR c]: exposes join keys written inside every branch of an OR
    (TPC-H Q19), so the join is an equi-join instead of a filtered cross product."""
    branches = [conjuncts(d) for d in disjuncts(e)]
    if len(branches) < 2:
        return [e]
    texts = [{str(c) for c in b} for b in branches]
    common_text = set.intersection(*texts)
    if not common_text:
        return [e]
    common = [c for c in branches[0] if str(c) in common_text]
    rest = [[c for c in b if str(c) not in common_text] for b in branches]
    if any(not r for r in rest):
        return common
    ors = and_(rest[0])
    for r in rest[1:]:
        ors = Func("or", [ors, and_(r)], T.BOOL)
    return common + [ors]

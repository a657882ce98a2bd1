"""Result types of SQL arithmetic (DuckDB's rules) and the scale of exact numeric types."""
from __future__ import annotations

from opforge.sql import types as T
from opforge.sql.errors import NotSupportedError, OutOfRangeError, SqlError
from opforge.sql.expr.tree import Expr


def _int_digits(t: T.SqlType) -> int:
    return {"INT32": 10, "INT64": 19, "BOOL": 1}[t.kind]


def as_decimal_type(t: T.SqlType, lit: Expr | None = None) -> T.SqlType:
    if t.kind == "DECIMAL":
        return t
    return T.decimal(_int_digits(t), 0)


def scale_of(t: T.SqlType) -> int | None:
    if t.kind == "DECIMAL":
        return t.scale
    return 0 if t.kind in ("INT32", "INT64", "BOOL") else None


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
        da, db = as_decimal_type(ta, a), as_decimal_type(tb, b)
        wide = da.wide or db.wide
        if op == "*":
            p = da.precision + db.precision
            if da.scale + db.scale > 38:
                raise OutOfRangeError(f"Needed scale {da.scale + db.scale} to accurately represent the "
                                      "multiplication result, but this is out of range of the DECIMAL type. "
                                      "Max scale is 38")
            return T.decimal(min(p, 18) if da.precision <= 18 and db.precision <= 18 else p, da.scale + db.scale,
                             wide or None)
        s = max(da.scale, db.scale)
        return T.decimal(max(da.precision - da.scale, db.precision - db.scale) + s + (1 if op in "+-" else 0), s,
                         wide or None)
    return T.INT32 if ta.kind in ("INT32", "BOOL") and tb.kind in ("INT32", "BOOL") else T.INT64

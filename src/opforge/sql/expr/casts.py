"""CAST between SQL types on the device: the storage of one type converted to another's."""
from __future__ import annotations

import torch

from opforge.sql import types as T
from opforge.sql.column import Column
from opforge.sql.errors import NotSupportedError, SqlError
from opforge.sql.expr.evaluation import FUNCS


def scale_up(v: torch.Tensor, k: int) -> torch.Tensor:
    if k <= 0:
        return v
    if v.numel() and bool((v.abs() > (2 ** 62) // (10 ** k)).any()):
        raise SqlError(f"overflow: rescaling a DECIMAL by 10^{k} exceeds its int64 storage")
    return v * (10 ** k)


def round_div(v: torch.Tensor, factor: int) -> torch.Tensor:
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
                return scale_up(v, to.scale - fr.scale)
            return round_div(v, 10 ** (fr.scale - to.scale))
        if fr.is_float:
            x = v.double() * (10 ** to.scale)
            return (torch.sign(x) * torch.floor(x.abs() + 0.5)).long()  # half away from zero
        return scale_up(v.long(), to.scale)
    if to.is_float:
        if fr.kind == "DECIMAL":
            return (v.double() / (10 ** fr.scale)).to(to.torch_dtype)
        return v.to(to.torch_dtype)
    if to.is_integer or to.kind == "BOOL":
        if fr.kind == "DECIMAL":
            v = round_div(v, 10 ** fr.scale)
        elif fr.is_float and to.kind != "BOOL":
            v = torch.sign(v) * torch.floor(v.abs() + 0.5)
        return (v != 0) if to.kind == "BOOL" else v.to(to.torch_dtype)
    if to.kind == "DATE" and fr.kind == "DATE":
        return v
    raise NotSupportedError(f"CAST from {fr} to {to}")


def coerce(col: Column, t: T.SqlType) -> Column:
    """A column cast to `t` (strings keep their own dictionaries; callers unify)."""
    if col.type == t or t.kind == "STRING":
        return col
    return Column(cast_values(col, t), col.valid, t)


def _cast(e, args, batch):
    (a,) = args
    return Column(cast_values(a, e.type), a.valid, e.type, a.dictionary if e.type.kind == "STRING" else None)


FUNCS["cast"] = _cast

"""CAST of a string column to DATE, integers or floats: each distinct string the rows use is parsed
once on the host (a dictionary word no row uses, as after a filter, is not read) and the values
are gathered through the codes on the device. A string that is no such value is DuckDB's
conversion error."""
from __future__ import annotations

import datetime

import torch

from opforge.sql import types as T
from opforge.sql.column import Column
from opforge.sql.errors import ConversionError
from opforge.sql.expr.evaluation import FUNCS

_BOUNDS = {"INT32": 2**31, "INT64": 2**63}


def parse(word: str, to: T.SqlType):
    text = word.strip()
    try:
        if to.kind == "DATE":
            return (datetime.date.fromisoformat(text) - datetime.date(1970, 1, 1)).days
        if to.is_integer:
            v = int(text)
            if not -_BOUNDS[to.kind] <= v < _BOUNDS[to.kind]:
                raise ValueError(text)
            return v
        return float(text)
    except ValueError:
        raise ConversionError(f"Could not convert string '{word}' to {to}") from None


def _string_cast(e, args, batch):
    (a,) = args
    to = e.type
    table = torch.zeros(max(len(a.dictionary or ()), 1), dtype=to.torch_dtype)
    if a.dictionary:
        used = torch.unique(a.values[a.valid_mask()]).tolist()
        for code in used:
            table[code] = parse(a.dictionary[code], to)
    codes = a.values.long() if a.dictionary else torch.zeros_like(a.values).long()
    return Column(table.to(a.device)[codes], a.valid, to)


FUNCS["string_cast"] = _string_cast

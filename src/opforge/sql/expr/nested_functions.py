"""Evaluators of the LIST / STRUCT functions (``frontend/nested_calls.py`` binds them; ``sql/nested.py``
has the columns): per distinct nested value where one nested column is read, else per row."""
from __future__ import annotations

import re

from opforge.sql import nested
from opforge.sql.errors import SqlError
from opforge.sql.expr.evaluation import FUNCS
from opforge.sql.expr.string_calls import regex

_POSIX = {"[:lower:]": "a-z", "[:upper:]": "A-Z", "[:digit:]": "0-9", "[:alpha:]": "a-zA-Z",
          "[:alnum:]": "a-zA-Z0-9", "[:space:]": r"\s", "[:xdigit:]": "0-9A-Fa-f", "[:word:]": r"\w"}


def re2(pattern: str, flags: str) -> re.Pattern:
    """RE2's POSIX classes inside brackets (``[[:lower:]]``), which Python's ``re`` lacks, then ``regex``."""
    for k, v in _POSIX.items():
        pattern = pattern.replace(k, v)
    return regex(pattern, flags.replace("g", ""))


def _matches(rx: re.Pattern, s: str):
    """RE2's global matching as DuckDB runs it: after an empty match the search moves on one character."""
    pos = 0
    while pos <= len(s):
        m = rx.search(s, pos)
        if m is None:
            return
        yield m
        pos = m.end() + 1 if m.end() == m.start() else m.end()


def _extract_all(e, cols, batch):
    kind, arg, flags = e.extra

    def run(s, pattern):
        if s is None or pattern is None:
            return None
        rx = re2(pattern, flags)
        if kind == "group":
            if not 0 <= arg <= rx.groups:
                raise SqlError(f"regexp_extract_all: group index {arg} is out of range (the pattern has {rx.groups} groups)")
            return [m.group(arg) or "" for m in _matches(rx, s)]
        if len(arg) > rx.groups:
            raise SqlError(f"regexp_extract_all: {len(arg)} group names for a pattern with {rx.groups} groups")
        return [{n: m.group(i + 1) for i, n in enumerate(arg)} for m in _matches(rx, s)]
    return nested.per_row(cols, run, e.type, batch.device, batch.n)


def _extract_struct(e, cols, batch):
    names, flags = e.extra

    def run(s, pattern):
        if s is None or pattern is None:
            return None
        rx = re2(pattern, flags)
        if len(names) > rx.groups:
            raise SqlError(f"regexp_extract: {len(names)} group names for a pattern with {rx.groups} groups")
        m = rx.search(s)
        return {n: (m.group(i + 1) or "") if m else "" for i, n in enumerate(names)}
    return nested.per_row(cols, run, e.type, batch.device, batch.n)


def _list_value(e, cols, batch):
    return nested.per_row(cols, lambda *xs: list(xs), e.type, batch.device, batch.n)


def _struct_pack(e, cols, batch):
    return nested.per_row(cols, lambda *xs: dict(zip(e.extra, xs)), e.type, batch.device, batch.n)


def _struct_extract(e, cols, batch):
    return nested.per_value(cols[0], lambda v: v.get(e.extra), e.type)


def _list_len(e, cols, batch):
    return nested.per_value(cols[0], len, e.type)


def _list_extract(e, cols, batch):
    return nested.per_row(cols, nested.list_element, e.type, batch.device, batch.n)


def _list_concat(e, cols, batch):
    def run(*lists):
        if e.extra and any(v is None for v in lists):
            return None
        return [x for v in lists if v is not None for x in v]
    return nested.per_row(cols, run, e.type, batch.device, batch.n)


_OPS = {"=": lambda a, b: a == b, "<>": lambda a, b: a != b, "<": lambda a, b: a < b,
        "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, ">=": lambda a, b: a >= b}


def _list_quantified(e, cols, batch):
    op, every = e.extra
    cmp = _OPS[op]

    def run(x, values):
        if not values:  # DuckDB: a NULL list is no elements, as an empty subquery
            return every
        results = [None if x is None or v is None else cmp(x, v) for v in values]
        if every:
            return False if False in results else (None if None in results else True)
        return True if True in results else (None if None in results else False)
    return nested.per_row(cols, run, e.type, batch.device, batch.n)


def _nested_cast(e, cols, batch):
    return nested.per_value(cols[0], lambda v: nested.coerce(v, e.type), e.type)


def _list_slice(e, cols, batch):
    return nested.per_row(cols, nested.slice_values, e.type, batch.device, batch.n)


FUNCS.update({
    "list_slice": _list_slice,
    "nested_cast": _nested_cast,
    "list_quantified": _list_quantified,
    "list_concat": _list_concat,
    "regexp_extract_all": _extract_all, "regexp_extract_struct": _extract_struct, "list_value": _list_value,
    "struct_pack": _struct_pack, "struct_extract": _struct_extract, "list_len": _list_len,
    "list_extract": _list_extract,
})

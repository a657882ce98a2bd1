"""Scalar functions of several arguments (strings, integers) evaluated once per distinct tuple of
argument values: ILIKE, LIKE ... ESCAPE, a pattern from a column, regexp_*, starts_with, strpos,
concat_ws, lpad, split_part, ...

Why per distinct tuple: string columns are dictionary-encoded, so the distinct (code, code, ...)
tuples present are found on the device with one ``torch.unique``; the Python function (host-side
regex and string code) runs once per tuple, and the results are gathered back through the inverse
index. A constant pattern over a column costs one call per distinct word, as for unary functions.

``Func("string_call", args, type, name)``: ``name`` keys :data:`CALLS`, whose entry says whether
the function is strict (NULL in, NULL out, without calling it)."""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Callable

import torch

from opforge.sql import types as T
from opforge.sql.column import Column
from opforge.sql.errors import SqlError
from opforge.sql.expr.evaluation import FUNCS


@dataclass(frozen=True)
class Call:
    fn: Callable
    strict: bool = True  # any NULL argument makes the result NULL (fn is not called)


def _keys(col: Column) -> torch.Tensor:
    """int64 keys whose equality is the equality of the values (codes for strings, bit patterns of floats)."""
    v = col.values
    if v.dtype.is_floating_point:
        return v.to(torch.float64).view(torch.int64)
    return v.to(torch.int64)


def _decode(col: Column, key: int, valid: bool):
    if not valid:
        return None
    if col.type.kind == "STRING":
        return col.dictionary[key]
    if col.values.dtype.is_floating_point:
        return torch.tensor([key], dtype=torch.int64).view(torch.float64).item()
    if col.type.kind == "BOOL":
        return bool(key)
    return key


def _string_call(e, args, batch):
    call = CALLS[e.extra]
    if batch.n == 0:
        return _build([], e.type, torch.zeros(0, dtype=torch.int64, device=batch.device), batch.device)
    parts = []
    for c in args:
        parts += [c.valid_mask().to(torch.int64), _keys(c)]
    uniq, inv = torch.unique(torch.stack(parts, dim=1), dim=0, return_inverse=True)
    results = []
    for row in uniq.cpu().tolist():
        values = [_decode(c, row[2 * i + 1], bool(row[2 * i])) for i, c in enumerate(args)]
        results.append(None if call.strict and any(v is None for v in values) else call.fn(*values))
    return _build(results, e.type, inv, batch.device)


def _build(results: list, typ: T.SqlType, inv: torch.Tensor, device) -> Column:
    """The column of ``results[inv[i]]`` (None: NULL)."""
    valid_table = torch.tensor([r is not None for r in results] or [True], dtype=torch.bool, device=device)
    valid = valid_table[inv] if len(results) else None
    if typ.kind == "STRING":
        words = tuple(sorted({r for r in results if r is not None}))
        pos = {w: i for i, w in enumerate(words)}
        table = torch.tensor([pos.get(r, 0) for r in results] or [0], dtype=torch.int32, device=device)
        values = table[inv] if len(results) else torch.zeros(len(inv), dtype=torch.int32, device=device)
        return Column(values, valid, typ, words)
    table = torch.tensor([0 if r is None else r for r in results] or [0], dtype=typ.torch_dtype, device=device)
    values = table[inv] if len(results) else torch.zeros(len(inv), dtype=typ.torch_dtype, device=device)
    return Column(values, valid, typ)


# --------------------------------------------------------------------------------------- patterns
@functools.lru_cache(maxsize=256)
def like_pattern(pattern: str, escape: str | None, fold: bool) -> re.Pattern:
    """A LIKE pattern as a regex: ``%`` any run, ``_`` one character, ``escape`` makes the next
    character literal (DuckDB: an empty escape string disables escaping; more than one character,
    or a pattern ending in the escape character, is an error). ``fold``: ILIKE (lower-case both)."""
    if escape is not None and len(escape) > 1:
        raise SqlError("Syntax Error: Invalid escape string. Escape string must be empty or one character.")
    if fold:
        pattern = pattern.lower()
    out, i = [], 0
    while i < len(pattern):
        ch = pattern[i]
        if escape and ch == escape:
            if i + 1 == len(pattern):
                raise SqlError("Syntax Error: Like pattern must not end with escape character!")
            out.append(re.escape(pattern[i + 1]))
            i += 2
            continue
        out.append(".*" if ch == "%" else "." if ch == "_" else re.escape(ch))
        i += 1
    return re.compile("".join(out), re.DOTALL)


def _like(fold: bool, negate: bool):
    def run(s, pattern, escape=None):
        hit = like_pattern(pattern, escape, fold).fullmatch(s.lower() if fold else s) is not None
        return hit != negate
    return run


_RE_FLAGS = {"i": re.IGNORECASE, "c": 0, "s": re.DOTALL, "m": re.MULTILINE, "n": re.MULTILINE, "p": re.MULTILINE,
             "l": 0, "g": 0}


@functools.lru_cache(maxsize=256)
def regex(pattern: str, flags: str = "") -> re.Pattern:
    """RE2's syntax as Python's ``re`` reads it (the common subset); DuckDB's option letters."""
    bits = 0
    for f in flags:
        if f not in _RE_FLAGS:
            raise SqlError(f"regexp: unrecognized option {f!r}")
        bits |= _RE_FLAGS[f]
    if "c" in flags and "i" not in flags.split("c")[-1]:
        bits &= ~re.IGNORECASE
    try:
        return re.compile(pattern, bits)
    except re.error as err:
        raise SqlError(f"regexp: invalid pattern {pattern!r}: {err}") from None


def _re2_replacement(repl: str) -> Callable[[re.Match], str]:
    """RE2's rewrite string (``\\0``..``\\9`` groups, ``\\\\`` a backslash) as a match -> text function."""
    def run(m: re.Match) -> str:
        out, i = [], 0
        while i < len(repl):
            ch = repl[i]
            if ch == "\\" and i + 1 < len(repl):
                nxt = repl[i + 1]
                if nxt.isdigit():
                    g = m.group(int(nxt)) if int(nxt) <= (m.re.groups or 0) else None
                    out.append(g or "")
                else:
                    out.append(nxt)
                i += 2
                continue
            out.append(ch)
            i += 1
        return "".join(out)
    return run


def regexp_replace(s, pattern, repl, flags=""):
    flags = flags or ""
    return regex(pattern, flags.replace("g", "")).sub(_re2_replacement(repl), s, count=0 if "g" in flags else 1)


def regexp_extract(s, pattern, group=0, flags=""):
    rx = regex(pattern, flags or "")
    if not 0 <= group <= rx.groups:
        raise SqlError(f"regexp_extract: group index {group} is out of range (the pattern has {rx.groups} groups)")
    m = rx.search(s)
    return (m.group(group) or "") if m else ""


def regexp_escape(s: str) -> str:
    """RE2's QuoteMeta: every ASCII character but letters, digits and '_' gets a backslash."""
    out = []
    for ch in s:
        if ch == "\0":
            out.append("\\x00")
        elif ord(ch) < 128 and not (ch.isalnum() or ch == "_"):
            out.append("\\" + ch)
        else:
            out.append(ch)
    return "".join(out)


# ----------------------------------------------------------------------------------- plain strings
def strpos(s, sub):
    return s.find(sub) + 1


def concat_ws(sep, *parts):
    if sep is None:
        return None
    return sep.join(str(p) for p in parts if p is not None)


def pad(left: bool):
    def run(s, count, fill):
        if count <= len(s):
            return s[:max(count, 0)]
        if fill == "":
            raise SqlError("pad: the fill string must not be empty")
        need = count - len(s)
        filler = (fill * (need // len(fill) + 1))[:need]
        return filler + s if left else s + filler
    return run


def split_part(s, sep, index):
    parts = list(s) if sep == "" else s.split(sep)
    if index == 0:
        return ""
    if index < 0:
        index += len(parts) + 1
    return parts[index - 1] if 1 <= index <= len(parts) else ""


def left(s, n):
    return s[:n] if n >= 0 else s[:max(len(s) + n, 0)]


def right(s, n):
    return s[len(s) - n:] if 0 <= n <= len(s) else s if n >= 0 else s[min(-n, len(s)):]


def chr_(code):
    if not 0 <= code <= 0x10FFFF or 0xD800 <= code <= 0xDFFF:
        raise SqlError(f"chr: invalid Unicode code point {code}")
    return chr(code)


def ascii_(s):
    return ord(s[0]) if s else 0


CALLS: dict[str, Call] = {
    "like": Call(_like(False, False)), "not_like": Call(_like(False, True)),
    "ilike": Call(_like(True, False)), "not_ilike": Call(_like(True, True)),
    "starts_with": Call(lambda s, p: s.startswith(p)), "ends_with": Call(lambda s, p: s.endswith(p)),
    "contains": Call(lambda s, p: p in s), "strpos": Call(strpos),
    "concat_ws": Call(concat_ws, strict=False),
    "regexp_matches": Call(lambda s, p, f="": regex(p, f or "").search(s) is not None),
    "regexp_full_match": Call(lambda s, p, f="": regex(p, f or "").fullmatch(s) is not None),
    "regexp_replace": Call(regexp_replace), "regexp_extract": Call(regexp_extract),
    "regexp_escape": Call(regexp_escape),
    "replace": Call(lambda s, a, b: s.replace(a, b)), "lpad": Call(pad(True)), "rpad": Call(pad(False)),
    "split_part": Call(split_part), "left": Call(left), "right": Call(right),
    "reverse": Call(lambda s: s[::-1]), "repeat": Call(lambda s, k: s * max(k, 0)),
    "chr": Call(chr_), "ascii": Call(ascii_), "unicode": Call(lambda s: ord(s[0]) if s else -1),
    "trim_both": Call(lambda s, c: s.strip(c)), "trim_leading": Call(lambda s, c: s.lstrip(c)),
    "trim_trailing": Call(lambda s, c: s.rstrip(c)),
}

FUNCS["string_call"] = _string_call

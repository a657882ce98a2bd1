"""String functions over dictionary-encoded columns: LIKE, SUBSTRING, UPPER/LOWER/LENGTH/TRIM,
concatenation and conversion to strings (once per distinct word, on the device or through Arrow)."""
from __future__ import annotations

import re

import pyarrow as pa
import pyarrow.compute as pc
import torch

from opforge.sql import strings
from opforge.sql import types as T
from opforge.sql.column import ARROW_MIN_WORDS, Column, arrow_dictionary, map_dictionary, map_dictionary_arrow
from opforge.sql.expr.evaluation import FUNCS, and_valid


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
        m = strings.like_words(a.dictionary, arrow_dictionary(a.dictionary), pattern, a.device)
        if m is not None:
            m = m[a.values.long()]
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
    """SUBSTRING with DuckDB's positions: a start of 0 is the position before the first character
    (substring('hello', 0, 2) = 'h', as PostgreSQL), a negative start counts from the end, a
    negative length takes the characters before the start; positions outside the string are cut."""
    start, length = extra
    begin = start - 1 if start > 0 else len(s) + start if start < 0 else -1
    if length is None:
        end = len(s)
    elif length >= 0:
        end = begin + length
    else:
        begin, end = begin + length, begin
    begin, end = max(begin, 0), min(end, len(s))
    return s[begin:end] if begin < end else ""


def _concat(e, args, batch):
    """a || b: strings are built once per distinct (code, code) pair present, then dictionary-encoded.
    CONCAT (``extra == "skip_nulls"``) reads a NULL operand as the empty string (code -1)."""
    cols = [a if a.type.kind == "STRING" else to_string(a) for a in args]
    skip_nulls = e.extra == "skip_nulls"
    codes = torch.stack([c.values.long() if not skip_nulls or c.valid is None
                         else torch.where(c.valid, c.values.long(), -1) for c in cols], dim=1)
    uniq, inv = torch.unique(codes, dim=0, return_inverse=True)
    host = uniq.cpu().tolist()
    words = ["".join(c.dictionary[k] if c.dictionary and k >= 0 else "" for c, k in zip(cols, row)) for row in host]
    merged = tuple(sorted(set(words)))
    pos = {w: i for i, w in enumerate(merged)}
    table = torch.tensor([pos[w] for w in words] or [0], dtype=torch.int32, device=batch.device)
    return Column(table[inv] if batch.n else torch.zeros(0, dtype=torch.int32, device=batch.device),
                  None if skip_nulls else and_valid(*cols), T.STRING, merged)


def _trim(s: str, extra) -> str:
    side, chars = extra
    if side == "LEADING":
        return s.lstrip(chars)
    return s.rstrip(chars) if side == "TRAILING" else s.strip(chars)


def to_string(col: Column) -> Column:
    if col.type.kind in ("LIST", "STRUCT"):  # DuckDB's text of the value: [1, 2], {'a': x}
        from opforge.sql import nested
        return nested.per_value(col, nested.text, T.STRING)
    # a 128-bit DECIMAL's rows are [n, 2]: unique rows, not words
    uniq, inv = torch.unique(col.values, return_inverse=True, **({"dim": 0} if col.values.dim() == 2 else {}))
    if col.type.kind == "DECIMAL":
        # format(.., "f"): plain digits as DuckDB prints them (str() gives '0E-10' for a zero of scale 10)
        words = [format(Column(uniq[i:i + 1], None, col.type).to_arrow()[0].as_py(), "f") for i in range(len(uniq))]
    elif col.type.kind == "DATE":
        words = [str(x) for x in Column(uniq, None, col.type).to_arrow().to_pylist()]
    elif col.type.kind == "FLOAT32":  # shortest text that reads back as the float32 (DuckDB's 0.1, not 0.100000001...)
        words = [str(x) for x in uniq.cpu().numpy()]
    elif col.type.kind == "BOOL":
        words = ["true" if x else "false" for x in uniq.cpu().tolist()]
    else:
        words = [str(x) for x in uniq.cpu().tolist()]
    merged = tuple(sorted(set(words)))
    pos = {w: i for i, w in enumerate(merged)}
    table = torch.tensor([pos[w] for w in words] or [0], dtype=torch.int32, device=col.device)
    return Column(table[inv], col.valid, T.STRING, merged)


def _cast_string(e, args, batch):
    return to_string(args[0])


_substring_words = _string_fn(_substring, _arrow_substring)


FUNCS.update({
    "like": _like, "upper": _string_fn(lambda s, _: s.upper()), "lower": _string_fn(lambda s, _: s.lower()),
    "length": _string_fn(lambda s, _: len(s)), "substring": _substring_run, "trim": _string_fn(_trim),
    "concat": _concat, "to_string": _cast_string,
})

"""substring_grapheme(s, start[, length]): SUBSTRING counted in grapheme clusters. Why only for
strings whose every code point is a cluster of its own: segmenting clusters (combining marks,
emoji sequences, Hangul syllables from jamo, ...) needs Unicode's segmentation rules; a string
that could hold a longer cluster is refused with a clear error instead of being cut inside one."""
from __future__ import annotations

import unicodedata

from opforge.sql.column import map_dictionary
from opforge.sql.errors import NotSupportedError
from opforge.sql.expr.evaluation import FUNCS
from opforge.sql.expr.string_functions import _substring


def _joins(ch: str) -> bool:
    """A code point that can extend or join a grapheme cluster."""
    o = ord(ch)
    return (unicodedata.category(ch) in ("Mn", "Me", "Mc", "Cf") or ch in "\u200d\r"
            or 0x1F1E6 <= o <= 0x1F1FF or 0x1F3FB <= o <= 0x1F3FF or 0xFE00 <= o <= 0xFE0F
            or 0x1100 <= o <= 0x11FF or 0xAC00 <= o <= 0xD7A3 or 0xE0020 <= o <= 0xE007F)


def substring_grapheme(s: str, extra) -> str:
    if any(_joins(ch) for ch in s):
        raise NotSupportedError(f"substring_grapheme of a string with multi-code-point grapheme clusters: {s!r}")
    return _substring(s, extra)


def _run(e, args, batch):
    (a,) = args
    return map_dictionary(a, lambda s: substring_grapheme(s, e.extra), e.type)


FUNCS["substring_grapheme"] = _run

"""``sql.strings.like`` (LIKE over a dictionary's bytes on the device, by whole-buffer passes)
against Python's ``re`` on random words and patterns: anchored and floating segments, ``_``
wildcards, repeated and overlapping segments, empty words, UTF-8 words; and whole queries through
the device path against DuckDB."""
import random
import re

import duckdb
import pyarrow as pa
import pytest

import opforge.sql as sql
from opforge.sql import expr, strings
from opforge.sql.column import ARROW_MIN_WORDS

ALPHABET = "ab_%c"


def regex_like(word: str, pattern: str) -> bool:
    rx = "".join(".*" if ch == "%" else "." if ch == "_" else re.escape(ch) for ch in pattern)
    return re.fullmatch(rx, word, re.DOTALL) is not None


def random_words(rng, n, alphabet="abcab c"):
    return sorted({"".join(rng.choice(alphabet) for _ in range(rng.randint(0, 9))) for _ in range(n)})


@pytest.mark.parametrize("seed", range(6))
def test_like_matches_python_regex(seed):
    rng = random.Random(seed)
    words = random_words(rng, 400)
    dw = strings.from_arrow(pa.array(words, pa.string()), "cpu")
    patterns = ["%", "", "a", "ab%", "%ab", "%ab%", "a%b", "%a%b%", "_b%", "%b_", "a_c", "%a%a%a%", "ab%ba",
                "%aa%", "__", "%c%", "c%c%c"]
    patterns += ["".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 6))) for _ in range(30)]
    for p in patterns:
        if "\\" in p:
            continue
        got = strings.like(dw, p).tolist()
        want = [regex_like(w, p) for w in words]
        assert got == want, p


def test_utf8_words_literal_segments_and_ascii_rule():
    words = sorted(["héllo", "hello", "ñandú", "año", "", "aé_é"])
    dw = strings.from_arrow(pa.array(words, pa.string()), "cpu")
    assert not dw.ascii
    for p in ["%é%", "h%o", "%ñ%", "a%o", "%é"]:
        assert strings.like(dw, p).tolist() == [regex_like(w, p) for w in words], p
    assert not strings.supports(dw, "h_llo")  # '_' is a character, not a byte: the host path
    with pytest.raises(ValueError, match="host path"):
        strings.like(dw, "h_llo")


def test_sliced_arrow_array_and_empty_dictionary():
    arr = pa.array(["zz", "abc", "xab", "q"], pa.string()).slice(1, 2)
    dw = strings.from_arrow(arr, "cpu")
    assert strings.like(dw, "%ab%").tolist() == [True, True]
    empty = strings.from_arrow(pa.array([], pa.string()), "cpu")
    assert strings.like(empty, "%a%").numel() == 0


def test_queries_through_the_device_path_match_duckdb(monkeypatch):
    rng = random.Random(7)
    n = 3 * ARROW_MIN_WORDS  # a dictionary large enough for the device path
    words = ["".join(rng.choice("abcde ") for _ in range(rng.randint(0, 15))) for _ in range(n)]
    t = pa.table({"k": list(range(n)), "w": words})
    monkeypatch.setattr(expr, "device_like", lambda col: True)  # the GPU's route, on CPU tensors
    con = sql.connect(device="cpu")
    con.register("t", t)
    ref = duckdb.connect()
    ref.register("t", t)
    calls = []
    real = strings.like
    monkeypatch.setattr(strings, "like", lambda dw, p: calls.append(p) or real(dw, p))
    for q in ["select count(*) from t where w like '%ab%c%'", "select count(*) from t where w not like 'a%e'",
              "select k from t where w like '_b%' order by k", "select count(*) from t where w like '%e'"]:
        assert con.sql(q).fetchall() == ref.sql(q).fetchall(), q
    assert len(calls) == 4  # every LIKE went through the device path

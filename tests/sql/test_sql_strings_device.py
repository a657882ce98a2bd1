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
from opforge.sql import strings
from opforge.sql.expr import string_functions
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
    monkeypatch.setattr(string_functions, "device_like", lambda col: True)  # the GPU's route, on CPU tensors
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


@pytest.mark.parametrize("seed", range(4))
def test_short_substring_matches_python_slices(seed):
    """Each word's slice and the new dictionary (sorted, distinct) against Python's slicing."""
    rng = random.Random(seed)
    words = random_words(rng, 300, "abcAB 9-")
    dw = strings.from_arrow(pa.array(words, pa.string()), "cpu")
    for begin, length in [(0, 2), (1, 3), (0, 0), (4, 7), (12, 2), (0, 7)]:
        codes, new = strings.short_substring(dw, begin, length)
        want = [w[begin:begin + length] for w in words]
        assert list(new) == sorted(set(want))
        assert [new[c] for c in codes.tolist()] == want


def test_short_substring_declines_what_it_cannot_do_exactly():
    ascii_words = strings.from_arrow(pa.array(["abc", "de"], pa.string()), "cpu")
    assert strings.short_substring(ascii_words, 0, strings.SHORT_MAX + 1) is None
    assert strings.short_substring(strings.from_arrow(pa.array(["ça", "b"], pa.string()), "cpu"), 0, 1) is None
    assert strings.short_substring(strings.from_arrow(pa.array(["a\0b", "b"], pa.string()), "cpu"), 0, 2) is None


def test_substring_queries_through_the_device_path_match_duckdb(monkeypatch):
    rng = random.Random(3)
    n = 3 * ARROW_MIN_WORDS
    words = [f"{rng.randint(10, 40)}-{rng.randint(0, 999):03d}-{i}" for i in range(n)]
    t = pa.table({"k": list(range(n)), "w": words, "v": [rng.random() for _ in range(n)]})
    monkeypatch.setattr(string_functions, "device_like", lambda col: True)
    calls = []
    real = strings.short_substring
    monkeypatch.setattr(strings, "short_substring", lambda *a: calls.append(a[1:]) or real(*a))
    con = sql.connect(device="cpu")
    con.register("t", t)
    ref = duckdb.connect()
    ref.register("t", t)
    for q in ["select substring(w, 1, 2) as c, count(*), sum(v) from t where substring(w, 1, 2) in ('13', '31', '23')"
              " group by c order by c",
              "select substring(w, 4, 3) as c, count(*) from t group by c order by c limit 5"]:
        got, want = con.sql(q).fetchall(), ref.sql(q).fetchall()
        assert [r[:2] for r in got] == [r[:2] for r in want], q
        assert all(abs(a[-1] - b[-1]) < 1e-6 * max(1.0, abs(b[-1])) for a, b in zip(got, want)), q
    assert len(calls) >= 3


@pytest.mark.parametrize("seed", range(3))
def test_like_over_a_dictionary_in_slices_equals_one_pass(monkeypatch, seed):
    """A dictionary past ``PIECE_BYTES`` is matched slice by slice (TPC-H o_comment at SF100: 7 GB
    of words): the slices' answers, put end to end, are the whole dictionary's."""
    rng = random.Random(seed)
    words = random_words(rng, 3000, alphabet="abc é%_")
    arrow = pa.array(words, pa.string()).slice(5)  # an offset into the buffers too
    words = tuple(words[5:])
    patterns = ["%ab%", "a%", "%c", "%a%b%c%", "é%", "%", "abc", "%b_%", "%__"]
    whole = {p: strings.like_words(words, arrow, p, "cpu") for p in patterns}
    monkeypatch.setattr(strings, "PIECE_BYTES", 40)
    for p in patterns:
        sliced = strings.like_words(tuple(words), arrow, p, "cpu")
        if whole[p] is None:  # '_' over non-ASCII words: the host's way, sliced or not
            assert sliced is None, p
            continue
        assert sliced is not None and sliced.tolist() == whole[p].tolist() == [regex_like(w, p) for w in words], p


def test_device_words_cache_keeps_few_bytes(monkeypatch):
    """Dictionaries kept on the device outlive their query: the cache holds at most ``_CACHE_BYTES``
    beyond its newest entry, least recently used out first."""
    monkeypatch.setattr(strings, "_CACHE", type(strings._CACHE)())
    monkeypatch.setattr(strings, "_CACHE_BYTES", 300)
    dicts = [tuple(f"{i}-{w:03d}" for w in range(20)) for i in range(4)]  # ~100 + 168 bytes each
    for d in dicts:
        strings.device_words(d, pa.array(d, pa.string()), "cpu")
    kept = [words for words, _ in strings._CACHE.values()]
    assert kept == dicts[-1:] and strings._cached_bytes() > 0
    small = tuple("ab")
    strings.device_words(small, pa.array(small, pa.string()), "cpu")
    assert [w for w, _ in strings._CACHE.values()] == [dicts[-1], small]

"""LIKE and SUBSTRING over large dictionaries run as one Arrow kernel over the dictionary
(``column.map_dictionary_arrow``) instead of a Python call per word: same answers as DuckDB,
including NOT LIKE, '_' wildcards and non-ASCII words
(SUBSTRING falls back to Python's code-point slicing)."""
import random

import duckdb
import pyarrow as pa
import pytest

import opforge.sql as sql
from opforge.sql.column import ARROW_MIN_WORDS


@pytest.fixture(scope="module")
def cons():
    rng = random.Random(3)
    n = 3 * ARROW_MIN_WORDS
    words = ["".join(rng.choice("abcdé _%") for _ in range(rng.randint(0, 12))) for _ in range(n)]
    phones = [f"{rng.randint(10, 34)}-{rng.randint(100, 999)}-{rng.randint(1000, 9999)}" for _ in range(n)]
    t = pa.table({"k": list(range(n)), "w": words, "p": phones})
    ours = sql.connect(device="cpu")
    ours.register("t", t)
    ref = duckdb.connect()
    ref.register("t", t)
    return ours, ref


@pytest.mark.parametrize("query", [
    "select count(*) from t where w like '%ab%c_'",
    "select count(*) from t where w not like 'a%'",
    "select count(*) from t where w like '_é%'",
    "select substring(p, 1, 2) as c, count(*) as n from t group by c order by c",
    "select substring(p, 4) as c, count(*) as n from t group by c order by c, n limit 20",
    "select substring(w, 2, 3) as c, count(*) as n from t group by c order by c, n limit 50",
])
def test_large_dictionary_string_functions_match_duckdb(cons, query):
    ours, ref = cons
    assert ours.sql(query).fetchall() == ref.sql(query).fetchall()

"""Issue 25: SUBSTRING with a start <= 0 counts the characters before the string as positions
(DuckDB and PostgreSQL: substring('hello', 0, 2) = 'h'); a negative start counts from the end."""
import pyarrow as pa
import pytest

from sql_reference import SqlCheck


@pytest.fixture(scope="module")
def check():
    return SqlCheck({"t": pa.table({"s": ["hello", "", "ab", "straße", None]})})


@pytest.mark.parametrize("args", ["0, 2", "0, 1", "0, 0", "1, 2", "2, 10", "0", "-1", "-3, 2", "-7, 3",
                                  "-10, 7", "5, 1", "6, 2", "-1, 1", "3"])
def test_substring_matches_duckdb(check, args):
    check(f"SELECT s, substring(s, {args}) AS x FROM t")

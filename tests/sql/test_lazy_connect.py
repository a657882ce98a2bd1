"""connect() + register() load no engine (issue 23): the parser, planner, executor and op library
wait for the first statement, which then answers as DuckDB does."""
import json
import os
import subprocess
import sys

import duckdb
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from opforge import sql
from opforge.sql.errors import NotSupportedError
from opforge.sql.table_source import TableSource

ENGINE = ("sqlglot", "opforge.ops", "opforge.sql.executor", "opforge.sql.frontend.binder")
QUERY = "SELECT o.k, sum(o.v) AS s, min(n.name) AS name FROM o JOIN n ON o.k = n.k GROUP BY o.k ORDER BY o.k"

CHILD = r"""
import json, sys
ENGINE = %r
def loaded():
    return sorted(m for m in sys.modules if m in ENGINE or m.startswith("opforge.ops.") or m == "pandas")
from opforge import sql
con = sql.connect("cpu").register("o", sys.argv[1])
after_parquet = loaded()
import pandas as pd
con.register("n", pd.DataFrame({"k": [1, 2, 3], "name": ["one", "two", "three"]}))
print(json.dumps({"after_parquet": after_parquet, "after_frame": loaded()}))
"""


def test_connect_and_register_load_no_engine(tmp_path):
    """In a fresh process; the first query (here, the same steps in this process) then answers."""
    path = tmp_path / "o.parquet"
    pq.write_table(pa.table({"k": [1, 2, 2, 3, 3, 3], "v": [1.5, 2.0, 3.0, 4.0, 5.0, 6.0]}), path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, "-c", CHILD % (ENGINE,), str(path)], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["after_parquet"] == []  # no engine, and no pandas: the user passed none
    assert got["after_frame"] == ["pandas"]

    frame = pd.DataFrame({"k": [1, 2, 3], "name": ["one", "two", "three"]})
    con = sql.connect("cpu").register("o", path).register("n", frame)
    assert isinstance(con._registered["o"], TableSource) and isinstance(con._registered["n"], TableSource)
    want = duckdb.sql(QUERY.replace("FROM o", f"FROM '{path}' o").replace("JOIN n", "JOIN frame n")).fetchall()
    assert con.sql(QUERY).fetchall() == want


def test_the_default_skew_threshold_is_the_executors():
    from opforge.sql import connection
    from opforge.sql.physical import context

    assert connection.DEFAULT_SKEW_THRESHOLD == context.DEFAULT_SKEW_THRESHOLD


def test_what_register_cannot_check_cheaply_fails_at_the_first_statement(tmp_path):
    """A Parquet file's column types are read with its footer, at the first statement: an
    unsupported one fails there, with register's error, and the table is not registered."""
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"x": pa.array([b"\x00\x01"], pa.binary())}), path)  # BLOB: no SQL type here
    con = sql.connect("cpu").register("d", path).register("ok", pa.table({"y": [7]}))
    assert con.tables() == ["d", "ok"]
    with pytest.raises(NotSupportedError):
        con.sql("SELECT y FROM ok")
    assert con.tables() == ["ok"]
    assert con.sql("SELECT y FROM ok").fetchall() == [(7,)]
    with pytest.raises(sql.SqlError, match="not a readable Parquet file"):
        con.register("t", _not_parquet(tmp_path))
    with pytest.raises(ValueError, match="join_algorithm"):  # options other than the defaults: checked at connect
        sql.connect("cpu", join_algorithm="sideways")


def _not_parquet(tmp_path):
    path = tmp_path / "text.parquet"
    path.write_text("a,b\n1,2\n")
    return path


@pytest.mark.parametrize("options", [{"workers": True}, {"runtime_filters": 1}, {"join_reordering": "sideways"}])
def test_options_equal_to_a_default_but_of_another_type_are_still_checked(options):
    with pytest.raises((TypeError, ValueError)):
        sql.connect("cpu", **options)

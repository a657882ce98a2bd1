"""``opforge sql``: one query from the command line, and the shell's commands
and multi-line statements, checked against DuckDB on the same file."""

from __future__ import annotations

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from rich.console import Console

from opforge import cli
from opforge.sql import shell


@pytest.fixture
def parquet(tmp_path):
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"k": [1, 2, 2, 3, None], "s": ["a", "b", "b", "c", "a"]}), path)
    return path


def test_one_query_prints_the_rows_duckdb_gives(parquet, capsys):
    q = "SELECT s, count(*) AS n FROM t GROUP BY s ORDER BY s"
    assert cli.main(["sql", q, "--table", f"t={parquet}", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    want = duckdb.sql(q.replace("FROM t", f"FROM '{parquet}'")).fetchall()
    for s, n in want:
        assert any(line.split("│")[1:3] == [f" {s} ", f" {n} "] for line in out.splitlines()
                   if line.count("│") >= 3), (s, n, out)
    assert f"{len(want)} rows" in out


def test_explain_flag_prints_the_plan(parquet, capsys):
    assert cli.main(["sql", "SELECT k FROM t WHERE k > 1", "--table", f"t={parquet}", "--device", "cpu",
                     "--explain"]) == 0
    out = capsys.readouterr().out
    assert "Scan t [k]" in out  # brackets survive: the plan is printed without rich markup


def test_bad_table_spec_is_a_clear_error():
    with pytest.raises(ValueError, match="name=path"):
        shell.open_connection(["t.parquet"], "cpu")


def test_shell_commands_and_multiline_statements(parquet):
    con = shell.open_connection([f"t={parquet}"], "cpu")
    feed = iter([".tables", ".schema t", "SELECT sum(k) AS total", "FROM t;", ".timer off",
                 "SELECT nope FROM t;", ".explain SELECT k FROM t", ".quit"])
    console = Console(record=True, width=200)
    assert shell.shell(con, console, read=lambda prompt: next(feed)) == 0
    text = console.export_text()
    assert "t" in text and "t(k " in text and "5 rows" in text
    (total,), = duckdb.sql(f"SELECT sum(k) FROM '{parquet}'").fetchall()
    assert f"│ {total} " in text
    assert "nope" in text and "Error" in text  # the unknown column is reported, the shell goes on
    assert "Scan t" in text

"""A crash-safe CLI (issue 25): every user error is one line (``--debug``
shows the traceback), and the ``opforge sql`` shell survives everything but
EOF: Ctrl-C, a RecursionError from a 3,000-term expression, a corrupt Parquet
file, and errors in its dot commands."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from rich.console import Console

from opforge import cli
from opforge.sql import shell

SRC = Path(__file__).resolve().parents[1] / "src"


@pytest.fixture
def files(tmp_path):
    good = tmp_path / "t.parquet"
    pq.write_table(pa.table({"k": [1, 2, 3]}), good)
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"PAR1" + os.urandom(200))  # a header, then garbage: no footer
    return good, bad


def _feed(items):
    """A fake ``input``: strings are lines, exceptions are raised (Ctrl-C), then EOF."""
    it = iter(items)

    def read(prompt):
        item = next(it, EOFError)
        if isinstance(item, type) and issubclass(item, BaseException) or isinstance(item, BaseException):
            raise item
        return item

    return read


def test_the_shell_survives_everything_but_eof(files):
    good, bad = files
    con = shell.open_connection([f"t={good}"], "cpu")
    deep = "SELECT " + " + ".join(["k"] * 3000) + " AS s FROM t;"
    console = Console(record=True, width=200)
    read = _feed([
        "CREATE VIEW v AS SELECT k * 10 AS k10 FROM t;",
        KeyboardInterrupt,                      # Ctrl-C at the prompt
        "SELECT k", KeyboardInterrupt,          # Ctrl-C inside a multi-line statement: it is dropped
        deep,                                   # RecursionError
        f".register bad {bad}",                 # corrupt Parquet
        ".schema nope",
        ".register",                            # a dot command used wrongly
        "SELECT sum(k10) AS total FROM v;",     # the session (its view) is still there
    ])
    assert shell.shell(con, console, read=read) == 0
    text = console.export_text()
    assert "Traceback" not in text
    assert text.count("^C") == 2
    assert "RecursionError" in text and "too deeply nested" in text
    assert "bad.parquet" in text and ("Parquet" in text or "parquet" in text)
    assert "│ 60 " in text  # sum(k * 10) over the view created first
    assert "usage: .register NAME PATH" in text


def test_ctrl_c_during_a_statement_keeps_the_shell(files, monkeypatch):
    good, _ = files
    con = shell.open_connection([f"t={good}"], "cpu")

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(shell, "run_statement", interrupted)
    console = Console(record=True, width=200)
    assert shell.shell(con, console, read=_feed(["SELECT k FROM t;", ".tables"])) == 0
    text = console.export_text()
    assert "interrupted" in text and "t" in text.split("interrupted")[-1]


def test_the_shell_with_debug_prints_the_traceback(files):
    good, _ = files
    con = shell.open_connection([f"t={good}"], "cpu")
    console = Console(record=True, width=200)
    assert shell.shell(con, console, read=_feed(["SELECT nope FROM t;"]), debug=True) == 0
    assert "Traceback" in console.export_text()


def test_a_bad_table_at_shell_start_is_reported_and_the_shell_opens(files, monkeypatch, capsys):
    good, bad = files
    seen = {}

    def fake_shell(con, console, read=input, debug=False):
        seen["tables"] = con.tables()
        return 0

    monkeypatch.setattr(shell, "shell", fake_shell)
    assert cli.main(["sql", "--table", f"t={good}", "--table", f"b={bad}", "--device", "cpu"]) == 0
    assert seen["tables"] == ["t"]
    err = capsys.readouterr().err
    assert "b=" in err and "Traceback" not in err


@pytest.mark.parametrize("argv,needle", [
    (["sql", "SELECT nope FROM t"], "nope"),
    (["sql", "SELECT " + " + ".join(["k"] * 3000) + " FROM t"], "too deeply nested"),
    (["sql", "SELECT 1", "--table", "b=BAD"], "bad.parquet"),
    (["sql", "SELECT 1", "--table", "nonsense"], "name=path"),
    (["tune", "--import", "/no/such/file.jsonl"], "/no/such/file.jsonl"),
])
def test_one_shot_user_errors_are_one_line(files, capsys, argv, needle):
    good, bad = files
    argv = [a.replace("BAD", str(bad)) for a in argv]
    if argv[0] == "sql" and "--table" not in argv:
        argv += ["--table", f"t={good}"]
    argv += ["--device", "cpu"] if argv[0] == "sql" else []
    assert cli.main(argv) == 1
    cap = capsys.readouterr()
    lines = [line for line in cap.err.splitlines() if line.strip()]
    assert len(lines) == 1, cap.err
    assert lines[0].startswith("opforge: error:") and needle in lines[0] and "--debug" in lines[0]
    assert "Traceback" not in cap.out + cap.err


def test_debug_anywhere_on_the_line_shows_the_traceback(files, capsys):
    good, _ = files
    assert cli.main(["sql", "SELECT nope FROM t", "--table", f"t={good}", "--device", "cpu", "--debug"]) == 1
    assert "Traceback" in capsys.readouterr().err
    assert cli.main(["--debug", "tune", "--import", "/no/such/file.jsonl"]) == 1
    assert "Traceback" in capsys.readouterr().err


def test_ctrl_c_in_a_one_shot_command_is_one_line(monkeypatch, capsys):
    from opforge import doctor

    def interrupted(console):
        raise KeyboardInterrupt

    monkeypatch.setattr(doctor, "run", interrupted)
    assert cli.main(["doctor"]) == 130
    err = capsys.readouterr().err
    assert err.strip() == "opforge: interrupted"


def test_the_real_shell_over_piped_stdin(files):
    """End to end: `python -m opforge sql` reading a script on stdin, a bad statement in the middle."""
    good, bad = files
    script = "SELECT nope FROM t;\n.register b " + str(bad) + "\nSELECT count(*) AS n FROM t;\n"
    env = dict(os.environ, PYTHONPATH=str(SRC), COLUMNS="120")
    p = subprocess.run([sys.executable, "-m", "opforge", "sql", "--table", f"t={good}", "--device", "cpu"],
                       input=script, capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "Traceback" not in p.stdout + p.stderr
    assert "nope" in p.stdout and "1 row" in p.stdout

"""Runs DuckDB's sqllogictest files on opforge and reports the records passed per file.

    python tests/sql/sqllogic/runner.py [--dir PEER_DIR] [--json report.json] [--timeout S] [FILE ...]

Each file runs on a fresh ``opforge.sql.connect(device='cpu')`` (SOURCE.md next to the peer files
says how they are run). A file that runs past ``--timeout`` seconds stops there: its remaining
records count as not passed. Results are compared with sqllogictest's rules: values as text,
``NULL`` and ``(empty)``, booleans as true/false or 1/0, numbers by value (floating point within 1%),
``N values hashing to <md5>`` over DuckDB's text of each value. Runs in its own process (the
test starts it) because the per-file timeout uses SIGALRM."""
from __future__ import annotations

import argparse
import collections
import contextlib
import datetime
import decimal
import hashlib
import json
import math
import os
import re
import signal
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
if __package__ in (None, ""):
    sys.path.insert(0, HERE)
from records import Record, parse_file  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))


def _find_peer_dir() -> str | None:
    """$OPFORGE_PEER_TESTS, else ``shared/peer-tests/duckdb-sqllogictest`` next to the checkout or a
    folder above it (a worktree sits deeper than the main checkout). None when absent (a clean clone)."""
    if os.environ.get("OPFORGE_PEER_TESTS"):
        return os.environ["OPFORGE_PEER_TESTS"]
    d = REPO
    while os.path.dirname(d) != d:
        d = os.path.dirname(d)
        cand = os.path.join(d, "shared", "peer-tests", "duckdb-sqllogictest")
        if os.path.isdir(cand):
            return cand
    return None


PEER_DIR = _find_peer_dir()
HASH_OPS = ("hash_join", "group_by", "segment_reduce", "blocked_bloom_probe", "cumsum")
_VERIFICATION = re.compile(r"^\s*pragma\s+(enable|disable)_verification\s*;?\s*$", re.IGNORECASE)


class FileTimeout(BaseException):  # not Exception: the engine's own handlers must not catch it
    pass


def peer_files(root: str) -> list[str]:
    out = []
    for d, _, names in os.walk(root):
        out.extend(os.path.relpath(os.path.join(d, n), root) for n in names if n.endswith(".test"))
    return sorted(out)


# ------------------------------------------------------------------------------------------ values
def value_text(v) -> str:
    """DuckDB's text of one result value, as its sqllogictest runner prints it."""
    if v is None:
        return "NULL"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, decimal.Decimal):
        return format(v, "f")
    if isinstance(v, (datetime.date, datetime.datetime)):
        return v.isoformat(sep=" ") if isinstance(v, datetime.datetime) else v.isoformat()
    if isinstance(v, (list, dict)):  # DuckDB's text of a LIST / STRUCT: [1, NULL], {'a': x} (strings unquoted)
        return _nested_text(v)
    s = str(v)
    return "(empty)" if s == "" else s


def _nested_text(v) -> str:
    if v is None:
        return "NULL"
    if isinstance(v, list):
        return "[" + ", ".join(_nested_text(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"'{k}': {_nested_text(x)}" for k, x in v.items()) + "}"
    return "''" if v == "" else value_text(v)


def _number(s: str):
    try:
        return float(s)
    except ValueError:
        return None


def values_match(actual: str, expected: str) -> bool:
    if actual == expected:
        return True
    if "NULL" in (actual, expected):
        return False
    bools = {"true": "1", "false": "0"}  # DuckDB's runner casts the expected text: 'False' is false
    if bools.get(actual.lower(), actual) == bools.get(expected.lower(), expected):
        return True
    a, e = _number(actual), _number(expected)
    if a is None or e is None:
        return False
    if math.isnan(a) or math.isnan(e):
        return math.isnan(a) and math.isnan(e)
    if a == e:
        return True
    return abs(a - e) <= 0.01 * max(abs(a), abs(e))


def _sorted_values(rows: list[list[str]], mode: str) -> list[str]:
    if mode == "rowsort":
        rows = sorted(rows)
    flat = [v for r in rows for v in r]
    return sorted(flat) if mode == "valuesort" else flat


def check_query(rec: Record, rows: list[list[str]], labels: dict) -> str:
    """'' when the result matches the record, else why not."""
    ncols = len(rec.types)
    if rows and len(rows[0]) != ncols:
        return f"{len(rows[0])} columns, expected {ncols}"
    actual = _sorted_values(rows, rec.sort)
    digest = hashlib.md5("".join(v + "\n" for v in actual).encode()).hexdigest()
    if rec.label and rec.label in labels and not rec.has_results:
        return "" if labels[rec.label] == digest else f"differs from the result labelled {rec.label}"
    if rec.label:
        labels[rec.label] = digest
    hashed = rec.hashed
    if hashed:
        n, md5 = hashed
        if len(actual) != n:
            return f"{len(actual)} values, expected {n}"
        return "" if md5 == digest else "hash differs"
    expected_rows = [line.split("\t") for line in rec.results]
    if ncols > 1 and all(len(r) == 1 for r in expected_rows) and len(expected_rows) == len(rows) * ncols:
        expected_rows = [expected_rows[i:i + ncols] for i in range(0, len(expected_rows), ncols)]
        expected_rows = [[v[0] for v in r] for r in expected_rows]  # one value per line
    expected = _sorted_values(expected_rows, rec.sort)
    if len(actual) != len(expected):
        return f"{len(actual) // max(ncols, 1)} rows, expected {len(expected) // max(ncols, 1)}"
    for i, (a, e) in enumerate(zip(actual, expected)):
        if not values_match(a, e):
            if rec.sort == "nosort" or not _match_multiset(actual, expected):
                return f"value {i}: {a!r}, expected {e!r}"
            return ""
    return ""


def _match_multiset(actual: list[str], expected: list[str]) -> bool:
    """Sorted as text, 1.0 and 1 can land in different places: match every value up to tolerance."""
    left = list(expected)
    for a in actual:
        for j, e in enumerate(left):
            if values_match(a, e):
                del left[j]
                break
        else:
            return False
    return True


# ------------------------------------------------------------------------------------------- files
def _failure_reason(e: BaseException) -> str:
    msg = str(e).splitlines()[0] if str(e) else ""
    return f"{type(e).__name__}: {msg}"[:200]


def run_file(path: str, timeout: float | None) -> dict:
    """Runs one file's records in order; returns {'total', 'passed', 'failures': [...]}. ``timeout``:
    seconds (SIGALRM; None: no limit, for callers whose own alarm must stay, as under pytest-timeout)."""
    import opforge.sql as sql
    from opforge.sql.errors import SqlError

    records = parse_file(path)
    con = sql.connect(device="cpu")
    labels: dict = {}
    passed, failures = 0, []

    def alarm(*_):
        raise FileTimeout()

    if timeout is not None:
        old = signal.signal(signal.SIGALRM, alarm)
        signal.setitimer(signal.ITIMER_REAL, timeout)
    i = 0
    try:
        for i, rec in enumerate(records):
            why = _run_record(con, rec, labels, SqlError)
            if why:
                failures.append({"line": rec.line, "reason": why})
            else:
                passed += 1
        i = len(records)
    except FileTimeout:
        failures.extend({"line": r.line, "reason": "timeout"} for r in records[i:])
    finally:
        if timeout is not None:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
    return {"total": len(records), "passed": passed, "failures": failures}


def _run_record(con, rec: Record, labels: dict, SqlError) -> str:
    if rec.skip:
        return f"skipped: {rec.skip}"
    if rec.kind == "statement" and _VERIFICATION.match(rec.sql):
        return ""  # a DuckDB test setting: nothing to run
    try:
        if rec.kind == "statement":
            con.sql(rec.sql).fetchall()
        else:
            table = con.sql(rec.sql).to_arrow()
    except FileTimeout:
        raise
    except SqlError as e:
        return "" if rec.expect_error else _failure_reason(e)
    except Exception as e:  # noqa: BLE001 - an engine crash is a failed record, with its cause
        return "crash " + _failure_reason(e)
    if rec.expect_error:
        return "expected an error"
    if rec.kind == "statement":
        return ""
    cols = [[value_text(v) for v in c.to_pylist()] for c in table.columns]
    rows = [list(r) for r in zip(*cols)] if cols else []
    return check_query(rec, rows, labels)


def run_all(root: str, files: list[str], timeout: float) -> dict:
    from opforge.runtime import dispatch

    report = {}
    # plain torch on the CPU: the Triton interpreter takes seconds per call. The forcing is held
    # open by the stack (an entered context manager left unreferenced is collected, and its exit runs)
    with contextlib.ExitStack() as stack:
        for op in HASH_OPS:
            stack.enter_context(dispatch.force_variant(op, "reference"))
        for rel in files:
            t0 = time.perf_counter()
            res = run_file(os.path.join(root, rel), timeout)
            res["seconds"] = round(time.perf_counter() - t0, 2)
            report[rel] = res
    return report


def summary(report: dict) -> dict:
    total = sum(r["total"] for r in report.values())
    passed = sum(r["passed"] for r in report.values())
    whole = sum(1 for r in report.values() if r["passed"] == r["total"])
    return {"files": len(report), "records": total, "passed": passed, "files_passed": whole}


def top_failures(report: dict, n: int = 25) -> list[tuple[str, int]]:
    """The commonest failure reasons, numbers and quoted names folded so alike causes count together."""
    counts = collections.Counter()
    for r in report.values():
        for f in r["failures"]:
            counts[re.sub(r"'[^']*'|\d+", "_", f["reason"])[:120]] += 1
    return counts.most_common(n)


def main(argv=None) -> int:
    os.environ.setdefault("OPFORGE_INTERPRET", "1")
    os.environ["TRITON_INTERPRET"] = "1" if os.environ["OPFORGE_INTERPRET"] == "1" else "0"
    os.environ.setdefault("OPFORGE_AUTOTUNE", "off")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=PEER_DIR)
    ap.add_argument("--json", help="write the per-file report here")
    ap.add_argument("--timeout", type=float, default=10.0, help="seconds per file")
    ap.add_argument("--failures", type=int, default=25, help="print the N commonest failure causes")
    ap.add_argument("files", nargs="*", help="paths under --dir (default: every .test file)")
    args = ap.parse_args(argv)
    files = args.files or peer_files(args.dir)
    report = run_all(args.dir, files, args.timeout)
    s = summary(report)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": s, "files": report}, f, indent=1)
    for rel, r in report.items():
        print(f"{r['passed']:4d}/{r['total']:<4d} {r['seconds']:6.2f}s  {rel}")
    for reason, count in top_failures(report, args.failures):
        print(f"{count:5d}  {reason}")
    print(f"passed {s['passed']} of {s['records']} records; {s['files_passed']} of {s['files']} files whole")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``opforge stream run FILE.py``: a job file's build(env, args) runs with a
progress line and its result printed; results are the job's own."""

import io
from pathlib import Path

import pytest
from rich.console import Console

from opforge import cli
from opforge.stream.cli import run_file
from opforge.stream.nexmark import NexmarkConfig, generate

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def console():
    buf = io.StringIO()
    return Console(file=buf, width=200), buf


def test_run_file_collects_the_result_and_reports_progress(tmp_path):
    job = tmp_path / "sums.py"
    job.write_text(
        "from opforge.stream import Aggregations, TumblingEventTimeWindows, WatermarkStrategy\n"
        "JOB_NAME = 'sums'\n"
        "def build(env, args):\n"
        "    n = args.events or 10\n"
        "    s = WatermarkStrategy.for_bounded_out_of_orderness(int(args.bound)).with_timestamp_assigner('t')\n"
        "    src = env.from_collection([{'k': i % 3, 'v': i, 't': i * 10} for i in range(n)], s)\n"
        "    return src.key_by('k').window(TumblingEventTimeWindows.of(100))"
        ".aggregate(Aggregations(with_window=True, total=('sum', 'v')))\n")
    con, buf = console()
    summary = run_file(str(job), device="cpu", events=300, batch_size=64, console=con, extra={"bound": "40"})
    want = {}
    for i in range(300):
        key = (i % 3, i * 10 - i * 10 % 100)
        want[key] = want.get(key, 0) + i
    got = {(r["key"], r["window_start"]): r["total"] for r in summary["result"]}
    assert got == want
    assert summary["job"] == "sums" and summary["events"] == 300 and summary["records"] == len(want)
    # one split: the newest event time minus (newest - bound - 1)
    assert summary["watermark_lag_ms"] == 41
    text = buf.getvalue()
    assert "events/s" in text and "watermark lag" in text and "batches queued" in text
    assert "WindowAggregate" in text and f"result: {len(want)} records" in text


def test_cli_runs_the_nexmark_example(capsys):
    rc = cli.main(["stream", "run", str(EXAMPLES / "stream_nexmark.py"), "--device", "cpu", "--events", "20000",
                   "--batch-size", "4096", "--set", "query=q7", "--show", "50"])
    assert rc == 0
    out = capsys.readouterr().out
    config = NexmarkConfig(events=20000, events_per_second=10_000, max_out_of_orderness_ms=500)
    bids = generate(config, "bid", 0, config.events, "cpu").records()
    top = {}
    for b in bids:
        w = b["date_time"] // 10_000
        top[w] = max(top.get(w, 0), b["price"])
    winners = [b for b in bids if b["price"] == top[b["date_time"] // 10_000]]
    assert f"result: {len(winners)} records" in out
    for b in winners:  # q7's rows: auction, price, bidder, date_time
        assert repr({k: b[k] for k in ("auction", "price", "bidder", "date_time")}) in out
    assert f"{len(bids):,} events in" in out


def test_cli_runs_the_joins_example(capsys):
    assert cli.main(["stream", "run", str(EXAMPLES / "stream_joins.py"), "--device", "cpu", "--events", "3000",
                     "--show", "0"]) == 0
    assert "IntervalJoin" in capsys.readouterr().out


def test_cli_errors(tmp_path, capsys):
    bad = tmp_path / "nobuild.py"
    bad.write_text("x = 1\n")
    assert cli.main(["stream", "run", str(bad)]) == 2
    assert "defines no build(env, args)" in capsys.readouterr().out
    assert cli.main(["stream", "run", str(tmp_path / "missing.py")]) == 2
    assert cli.main(["stream", "run", str(bad), "--set", "novalue"]) == 2
    failing = tmp_path / "failing.py"
    failing.write_text("def build(env, args):\n"
                       "    return env.from_collection([1, 2]).map(lambda x: 1 // (x - 2))\n")
    assert cli.main(["stream", "run", str(failing), "--device", "cpu"]) == 1
    assert "failing.py failed: ZeroDivisionError" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli.main(["stream"])

"""TPC-H on opforge's SQL engine against DuckDB on the same host.

    python benchmarks/tpch.py --sf 10 --device cuda [--repeats 5] [--queries 1,3,6] [--out PATH]
                              [--analyze] [--memory-budget BYTES] [--join-algorithm auto|hash|merge|nested_loop]

Generates (once, cached) TPC-H at the scale factor with tpchgen-cli, loads it
into an ``opforge.sql`` connection and into an in-memory DuckDB, runs the 22
queries warm on both, times each end to end (parse + plan + execute + result to
host; loading reported separately), checks every opforge answer against
DuckDB's, and writes ``benchmarks/results/tpch-<device>-sf<sf>-<date>.json``
plus a bar chart of the per-query medians next to it. ``--analyze`` adds, per query, the
EXPLAIN ANALYZE of one more run (per operator: rows, ms, bytes, GB/s, % of copy bandwidth, and
the registry ops / Triton kernels that ran) under ``operators`` in the JSON.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

from opforge.sql.tpch import data, queries, runner  # noqa: E402

SCHEMA_VERSION = 1


def parse_queries(text: str | None) -> tuple[int, ...]:
    if not text:
        return queries.NUMBERS
    numbers = tuple(int(q.strip().lower().lstrip("q")) for q in text.split(",") if q.strip())
    for n in numbers:
        queries.name(n)  # validates 1..22
    return numbers


def environment(device: str) -> dict:
    import duckdb
    import torch

    from opforge.runtime.device import versions

    info = versions()
    gpu = torch.cuda.get_device_name(0) if device.startswith("cuda") and torch.cuda.is_available() else ""
    return {
        "gpu": gpu,
        "driver": info.get("driver", ""),
        "torch": info.get("torch", ""),
        "triton": info.get("triton", ""),
        "opforge": info.get("opforge", ""),
        "duckdb": duckdb.__version__,
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
    }


def report(result: dict, args: argparse.Namespace, benchmark: str = "tpch") -> dict:
    """The JSON document written under benchmarks/results/ (TPC-DS's too)."""
    return {
        "schema_version": SCHEMA_VERSION,
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "benchmark": benchmark,
        "scale_factor": result["scale_factor"],
        "device": args.device,
        "repeats": args.repeats,
        "warmup": args.warmup,
        "duckdb_threads": args.duckdb_threads or os.cpu_count(),
        **environment(args.device),
        "load": result["load"],
        "total": result["total"],
        "queries": [r.to_json() for r in result["queries"]],
    }


def plot(doc: dict, path: Path) -> None:
    """Grouped bars of per-query median time, log scale, failed queries marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [q["query"] for q in doc["queries"]]
    ours = [q["opforge_median_ms"] or 0 for q in doc["queries"]]
    duck = [q["duckdb_median_ms"] or 0 for q in doc["queries"]]
    x = range(len(names))
    fig, ax = plt.subplots(figsize=(max(6, 0.5 * len(names) + 2), 4))
    ax.bar([i - 0.2 for i in x], ours, 0.4, label=f"opforge ({doc['device']})")
    ax.bar([i + 0.2 for i in x], duck, 0.4, label=f"DuckDB ({doc['duckdb_threads']} threads)")
    for i, q in enumerate(doc["queries"]):
        if q["error"] or q["match"] is False:
            ax.annotate("fail" if q["error"] else "wrong", (i - 0.2, max(duck[i], 1e-3)), ha="center", fontsize=6, color="red")
    ax.set_xticks(list(x), names, rotation=90)
    ax.set_yscale("log")
    ax.set_ylabel("median ms (warm, end to end)")
    ax.set_title(f"TPC-H SF{doc['scale_factor']:g}: {doc.get('gpu') or doc['device']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run_arguments(doc: str, benchmark: str, queries: int) -> argparse.ArgumentParser:
    """The options a TPC-H or TPC-DS run shares (``benchmarks/tpcds.py`` too)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sf", type=float, default=1.0, help="scale factor (default 1)")
    parser.add_argument("--device", default="cuda", help="opforge device (default cuda)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per query (median reported)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs per query before timing")
    parser.add_argument("--queries", default=None, help=f"comma list, e.g. 1,3,q06 (default all {queries})")
    parser.add_argument("--data-dir", default=None, help=f"cache root (default $OPFORGE_CACHE_DIR/{benchmark})")
    parser.add_argument("--duckdb-threads", type=int, default=None, help="DuckDB threads (default all cores)")
    parser.add_argument("--out", default=None, help=f"JSON path (default benchmarks/results/{benchmark}-...json)")
    return parser


def main(argv: list[str] | None = None, connect=None) -> dict:
    """Run the benchmark; ``connect(device)`` builds the engine connection (default ``opforge.sql.connect``)."""
    parser = run_arguments(__doc__, "tpch", 22)
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG bar chart")
    parser.add_argument("--analyze", action="store_true", help="add each query's EXPLAIN ANALYZE to the JSON")
    parser.add_argument("--memory-budget", type=int, default=None, help="bytes per hash table before radix partitioning")
    parser.add_argument("--join-algorithm", default="auto", help="auto (default), hash, merge or nested_loop")
    args = parser.parse_args(argv)
    numbers = parse_queries(args.queries)

    if connect is None:
        import opforge.sql as sql

        connect = sql.connect

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    console = Console(stderr=True)
    with console.status(f"TPC-H SF{args.sf:g}: generating / loading data"):
        data.generate(args.sf, args.data_dir)
    day = dt.date.today().isoformat()
    out = Path(args.out) if args.out else HERE / "results" / f"tpch-{args.device.replace(':', '')}-sf{args.sf:g}-{day}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(".partial.jsonl")
    partial.unlink(missing_ok=True)
    with Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console
    ) as progress:
        task = progress.add_task(f"TPC-H SF{args.sf:g} on {args.device}", total=len(numbers))

        def on_query(record):
            progress.update(task, advance=1, description=f"{record.query} done")
            with partial.open("a") as f:  # a run cut short by a time limit keeps the queries it finished
                f.write(json.dumps(record.to_json()) + "\n")

        kwargs = {}
        if args.memory_budget is not None or args.join_algorithm != "auto":
            kwargs = {"memory_budget": args.memory_budget, "join_algorithm": args.join_algorithm}
        con = connect(device=args.device, **kwargs)
        result = runner.run_tpch(
            con, args.sf, root=args.data_dir, numbers=numbers, repeats=args.repeats,
            warmup=args.warmup, duckdb_threads=args.duckdb_threads, on_query=on_query,
        )
    doc = report(result, args)
    if args.analyze:
        for q, n in zip(doc["queries"], numbers):
            if q["error"] is None and hasattr(con, "sql"):
                prof = con.sql(queries.query(n)).analyze()
                q["analyze_total_ms"] = prof.total_ms
                q["operators"] = prof.to_arrow().to_pylist()

    out.write_text(json.dumps(doc, indent=2) + "\n")
    partial.unlink(missing_ok=True)
    if not args.no_plot:
        plot(doc, out.with_suffix(".png"))

    table = Table(title=f"TPC-H SF{args.sf:g} (median ms, warm, end to end)")
    for col in ("query", "rows", "opforge", "of it: plan", "duckdb", "speedup", "check"):
        table.add_column(col, justify="right")
    def fmt(v):
        return "-" if v is None else f"{v:.2f}"

    for q in doc["queries"]:
        check = "ok" if q["match"] else ("error" if q["error"] else "WRONG")
        plan = statistics.median(q["opforge_plan_ms"]) if q["opforge_plan_ms"] else None
        table.add_row(q["query"], str(q["rows"]), fmt(q["opforge_median_ms"]), fmt(plan), fmt(q["duckdb_median_ms"]),
                      fmt(q["speedup"]), check)
    t = doc["total"]
    table.add_row("total", "", fmt(t["opforge_ms"]), fmt(t["opforge_plan_ms"]), fmt(t["duckdb_ms"]), fmt(t["speedup"]),
                  f"{t['queries_matching']}/{len(numbers)}")
    console.print(table)
    console.print(f"load: opforge {doc['load']['opforge_s']:.3f} s, DuckDB {doc['load']['duckdb_s']:.3f} s; wrote {out}")
    return doc


if __name__ == "__main__":
    main()

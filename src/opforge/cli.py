"""The ``opforge`` command: doctor, demo, bench, tune, selftest, profile, sql, pd, cluster, stream, warmup.

A user error is one line on stderr (``opforge: error: ...``) and exit status
1; ``--debug`` anywhere on the command line (or ``OPFORGE_DEBUG=1``) prints
the traceback instead. Ctrl-C is ``opforge: interrupted`` and status 130.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback

from rich.console import Console


# Commands whose arguments are declared inside a package that imports torch: their full parser is
# built only when that command runs (``opforge pd ctl`` must stay a small, torch-free process).
_HEAVY_COMMANDS = {
    "profile": ("opforge.profile.cli", "compiled resources, occupancy, bandwidth per config, ncu metrics of an op"),
    "stream": ("opforge.stream.cli", "DataStream jobs: run a job defined in a Python file"),
}


def _add_heavy(sub, name: str, command: str | None) -> None:
    module, help_text = _HEAVY_COMMANDS[name]
    if command == name:
        import importlib

        importlib.import_module(module).add_parser(sub)
    else:
        sub.add_parser(name, help=help_text)


def _parser(command: str | None = None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="opforge", description="A GPU operator runtime for Python.")
    p.add_argument("--debug", action="store_true",
                   help="print the traceback of an error (also accepted after the command)")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("doctor", help="versions, devices, backends, cache location")
    sub.add_parser("demo", help="a short tour on whatever device is here")

    b = sub.add_parser("bench", help="measure ops against the roofline and their peers")
    b.add_argument("--quick", action="store_true", help="small shapes (CPU smoke runs)")
    b.add_argument("--family", action="append", help="only these op families (default: all)")
    b.add_argument("--case", action="append",
                   help="only cases whose 'op label dtype' contains this (repeatable), e.g. 'amax 8x64'")
    b.add_argument("--json", dest="json_path", help="write the results as JSON here")
    b.add_argument("--plot", dest="plot_path", help="write a roofline PNG here")
    b.add_argument("--crossover-plot", help="write the variant-crossover PNG here")
    b.add_argument("--no-crossover", action="store_true", help="skip the variant size sweep")
    b.add_argument("--no-host", action="store_true", help="skip dispatch-overhead and first-call figures")
    b.add_argument("--refresh-ceilings", action="store_true", help="measure the ceilings again")
    b.add_argument("--dist", action="store_true",
                   help="overlapped tensor-parallel GEMM bench (torchrun --nproc-per-node N -m opforge bench --dist)")
    b.add_argument("--prewarm", type=int, default=None, metavar="N",
                   help="compile every case first in N worker processes (default: on a GPU, half the CPU cores)")

    t = sub.add_parser("tune", help="pre-tune shapes offline; import/export JSON lines")
    t.add_argument("--preset", choices=["elementwise", "bench", "sql", "stream"],
                   help="a prepared list of shapes ('bench': every shape of the bench grid), or an engine's "
                        "workload run in mode 'on' ('sql': the 22 TPC-H queries; 'stream': the Nexmark queries)")
    t.add_argument("--sf", type=float, default=1.0, help="with --preset sql: the TPC-H scale factor")
    t.add_argument("--queries", help="with --preset sql/stream: only these queries, e.g. 1,6 or q5,q7")
    t.add_argument("--events", type=int, default=1_000_000, help="with --preset stream: Nexmark events")
    t.add_argument("--batch-size", type=int, default=65_536, help="with --preset stream: micro-batch size")
    t.add_argument("--device", help="with --preset sql/stream: cuda or cpu (default: cuda when available)")
    t.add_argument("--family", action="append", help="with --preset bench: only these op families")
    t.add_argument("--budget", type=float, help="stop starting new shapes after this many seconds")
    t.add_argument("--show", action="store_true", help="print every config's time")
    t.add_argument("--op", help="op name, e.g. add")
    t.add_argument("--shape", action="append", default=[], help="e.g. 4096x4096 (repeatable)")
    t.add_argument("--other", default="same", help="binary ops: 'same', 'scalar', 'none' or a shape")
    t.add_argument("--dtype", default="bf16", choices=["fp32", "bf16", "fp16", "fp64", "float32", "bfloat16",
                                                      "float16", "float64"])
    t.add_argument("--mode", choices=["on", "exhaustive"],
                   help="exhaustive (default, except for --preset sql/stream: on): every supported variant "
                        "(dispatch then compares them); on: the variant dispatch prefers")
    t.add_argument("--quick", action="store_true", help="a smaller preset")
    t.add_argument("--export", dest="export_path", help="write the cache as JSON lines")
    t.add_argument("--import", dest="import_path", help="merge JSON lines into the cache")
    t.add_argument("--clear", action="store_true", help="empty the cache first")

    s = sub.add_parser("selftest", help="compile and check every variant on this device")
    s.add_argument("--sanitize", action="store_true", help="rerun under compute-sanitizer memcheck")
    s.add_argument("--op", action="append", help="only these ops (repeatable; 'cumsum', 'cross_entropy*')")
    s.add_argument("--jobs", type=int, default=1, help="check the variants in this many processes at once")
    s.add_argument("--shard", default="0/1", help="K/N: check every N-th variant from the K-th")
    s.add_argument("--json", dest="json_path", help="write the results as JSON here")

    _add_heavy(sub, "profile", command)

    from opforge.warmup import command as warmup_command

    w = sub.add_parser("warmup", help="compile the kernels the SQL/stream engines and tensor ops use, ahead of time")
    warmup_command.add_arguments(w)

    q = sub.add_parser("sql", help="run a SQL query on registered tables, or an interactive shell")
    q.add_argument("query", nargs="?", help="the query; none: an interactive shell")
    q.add_argument("--table", action="append", default=[], help="name=path.parquet|path.csv (repeatable)")
    q.add_argument("--device", help="cuda or cpu (default: cuda when available)")
    q.add_argument("--explain", action="store_true", help="print the plan instead of running the query")

    from opforge.placement import cli as pd_cli

    pd_cli.add_parser(sub)
    from opforge.cluster import cli as cluster_cli

    cluster_cli.add_parser(sub)
    _add_heavy(sub, "stream", command)
    return p


def _prewarm_workers(asked: int | None) -> int:
    """Parallel compilation only pays where timing is serial GPU work; on CPU it would compete with it."""
    if asked is not None:
        return asked
    import torch

    return min(8, (os.cpu_count() or 2) // 2) if torch.cuda.is_available() else 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or os.environ.get("OPFORGE_DEBUG", "") not in ("", "0")
    argv = [a for a in argv if a != "--debug"]
    command = next((a for a in argv if not a.startswith("-")), None)
    args = _parser(command).parse_args(argv)
    args.debug = debug
    console = Console(width=None if sys.stdout.isatty() else 150)
    errors = Console(stderr=True, width=None if sys.stderr.isatty() else 1_000_000, highlight=False)
    try:
        return _run(args, console, errors)
    except KeyboardInterrupt:
        if debug:
            raise
        errors.print("opforge: interrupted", markup=False)
        return 130
    except Exception as e:  # noqa: BLE001 - every error is one line unless --debug
        if debug:
            errors.print(traceback.format_exc().rstrip(), markup=False)
            return 1
        from opforge.sql.shell import describe_error

        errors.print(f"opforge: error: {describe_error(e)} (--debug for the traceback)", markup=False,
                     soft_wrap=True)
        return 1


def _run(args, console: Console, errors: Console) -> int:
    if args.command == "doctor":
        from opforge import doctor

        doctor.run(console)
        return 0
    if args.command == "demo":
        from opforge import demo

        demo.run(console)
        return 0
    if args.command == "bench" and args.dist:
        from opforge.distributed import bench as dist_bench

        return dist_bench.main((["--quick"] if args.quick else []) + (["--json", args.json_path] if args.json_path else []))
    if args.command == "bench":
        from opforge.bench import harness, plot

        result = harness.run(quick=args.quick, families=args.family, crossover=not args.no_crossover,
                             host=not args.no_host, refresh_ceilings=args.refresh_ceilings, console=console,
                             checkpoint=args.json_path, prewarm_workers=_prewarm_workers(args.prewarm),
                             cases=args.case)
        harness.report(result, console)
        if args.json_path:
            harness.write_json(result, args.json_path)
            console.print(f"wrote {args.json_path}")
        if args.plot_path:
            plot.roofline_png(result, args.plot_path)
            console.print(f"wrote {args.plot_path}")
        if args.crossover_plot and result["crossover"]:
            plot.crossover_png(result["crossover"], args.crossover_plot,
                               f"variant crossover on {result['gpu']} ({result['date']})")
            console.print(f"wrote {args.crossover_plot}")
        bad = [e for e in result["entries"] + result["crossover"] if not e.get("correct", False)]
        return 1 if bad else 0
    if args.command == "tune":
        from opforge import tune

        return tune.run(args, console)
    if args.command == "profile":
        from opforge.profile import cli as profile_cli

        return profile_cli.run(args, console)
    if args.command == "sql":
        from opforge.sql import shell

        if args.query is None:  # the shell opens even when a table cannot be loaded
            def skip(spec, e):
                errors.print(f"opforge: error: --table {spec}: {shell.describe_error(e)} (left out)",
                             markup=False, soft_wrap=True)

            con = shell.open_connection(args.table, args.device, on_error=skip)
            return shell.shell(con, console, debug=args.debug)
        con = shell.open_connection(args.table, args.device)
        if args.explain:
            console.print(con.sql(args.query).explain(), markup=False)
        else:
            shell.run_statement(con, args.query, console)
        return 0
    if args.command == "pd":
        from opforge.placement import cli as pd_cli

        return pd_cli.run(args, console)
    if args.command == "cluster":
        from opforge.cluster import cli as cluster_cli

        return cluster_cli.run(args, console)
    if args.command == "stream":
        from opforge.stream import cli as stream_cli

        return stream_cli.run(args, console)
    if args.command == "warmup":
        from opforge.warmup import command as warmup_command

        return warmup_command.run(args, console)
    if args.command == "selftest":
        from opforge import selftest

        if args.sanitize:
            return selftest.run_sanitized(console, args.op)
        k, _, n = args.shard.partition("/")
        if not (k.isdigit() and n.isdigit()):
            raise SystemExit(f"opforge selftest: --shard wants K/N (e.g. 0/4), got {args.shard!r}")
        results = selftest.run(console=console, ops=args.op, shard=(int(k), int(n)), jobs=args.jobs,
                               json_path=args.json_path)
        return 1 if any(r.failed for r in results) else 0
    return 2


if __name__ == "__main__":
    sys.exit(main())

"""`opforge profile` over every registered op: does the tool work for all of them?

For each op, the first selftest sample that one of its Triton variants accepts
(dispatch's pick when it is a Triton variant, else the first Triton variant
that takes the sample) goes through ``opforge.profile.config_sweep`` with
dispatch's config (``--max-configs`` for more): compiled resources,
theoretical occupancy and its limiter, and on a GPU the achieved time and
bandwidth. Every op compiles first, in ``--jobs`` processes side by side;
the timing is serial. Selftest samples are small, so the rates
show launch-bound kernels; the point is coverage, not speed (the bench has the
speed). One JSON row per op, errors included, and a table on the terminal.

    python benchmarks/profile_all.py --json out.json [--op softmax ...]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch


def describe(a) -> str:
    """An argument in a row: dtype and shape for a tensor (also inside lists and tuples)."""
    if isinstance(a, torch.Tensor):
        return f"{str(a.dtype).replace('torch.', '')}{tuple(a.shape)}"
    if isinstance(a, (list, tuple)):
        return "[" + ", ".join(describe(x) for x in a) + "]"
    return repr(a)


def pick(op, device):
    """(variant name, sample) of the first Triton variant that takes a sample."""
    from opforge.profile.resources import decide_for_profile
    from opforge.runtime import dispatch

    triton_variants = [v for v in op.variants if v.kind == "triton"]
    for args in op.samples(device):
        try:
            chosen = dispatch.decide(op, args, tune=False).variant
        except Exception:
            chosen = None
        order = ([chosen] if chosen in triton_variants else []) + [v for v in triton_variants if v is not chosen]
        for v in order:
            if device.type == "cuda":
                ok = dispatch.reject_reason(op, v, args) is None
            else:  # compile-only on CPU: the variant's own checks, as `opforge profile` applies them
                try:
                    decide_for_profile(op.name, args, v.name)
                    ok = True
                except Exception:
                    ok = False
            if ok:
                return v.name, args
    return None, None


def plan(op, device, max_configs: int) -> dict:
    """The op's row so far, with what to compile: its decision, args and configs."""
    from opforge.profile.resources import decide_for_profile
    from opforge.profile.sweep import pick_configs

    row = {"op": op.qualname}
    variant, args = pick(op, device)
    if variant is None:
        row["error"] = "no Triton variant takes any selftest sample here"
        return row
    row["variant"] = variant
    row["args"] = [describe(a) for a in args if a is not None]
    try:
        decision = decide_for_profile(op.name, args, variant)
        cpu = tuple(a.cpu() if isinstance(a, torch.Tensor) else a for a in args)
        configs = pick_configs(decision.config, list(decision.variant.configs(*cpu)), max_configs)
    except Exception as e:
        row["error"] = f"{type(e).__name__}: {e}"[:400]
        return row
    row["_todo"] = (decision, args, configs)
    return row


def finish(op, row: dict, resources: list) -> None:
    """Time the planned configs through ``config_sweep`` with their compiled resources."""
    from opforge.profile import config_sweep

    _, args, configs = row.pop("_todo")
    t0 = time.perf_counter()
    try:
        s = config_sweep(op.name, *args, variant=row["variant"], configs=configs, resources=resources)
    except Exception as e:
        row["error"] = f"{type(e).__name__}: {e}"[:400]
        return
    row["seconds"] = round(time.perf_counter() - t0, 2)
    chosen = next((r for r in s.rows if r.chosen), s.rows[0])
    row["configs"] = len(s.rows)
    row["config_errors"] = [r.error for r in s.rows if r.error]
    row["kernels"] = [{k: kern[k] for k in ("kernel", "registers", "spill_stores", "shared_bytes", "num_warps",
                                            "num_stages")}
                      | {"occupancy": kern["occupancy"]["occupancy"], "limiter": kern["occupancy"]["limiter"]}
                      for kern in chosen.kernels]
    row["median_ms"] = chosen.median_ms
    row["tbps"] = chosen.tbps
    row["pct_copy_bw"] = chosen.pct_copy_bw
    if chosen.error:
        row["error"] = chosen.error


def write(path, device, rows) -> None:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    with open(path, "w") as f:
        json.dump({"device": name, "torch": torch.__version__,
                   "rows": [{k: v for k, v in r.items() if k != "_todo"} for r in rows]}, f, indent=1, default=str)


def main(argv=None) -> int:
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    from opforge.profile.resources import ops_config_resources
    from opforge.runtime.registry import all_ops

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", dest="json_path", help="write the rows here")
    ap.add_argument("--op", action="append", help="only these ops (repeatable)")
    ap.add_argument("--max-configs", type=int, default=1, help="configs per op (default: dispatch's only)")
    ap.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) // 2),
                    help="compile processes (default: half the cores)")
    args = ap.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    ops = [op for op in all_ops() if any(v.kind == "triton" for v in op.variants)
           and (not args.op or op.name in args.op or op.qualname in args.op)]
    console = Console(width=200)
    with console.status(f"choosing variants and samples for {len(ops)} ops"):
        rows = [plan(op, device, args.max_configs) for op in ops]
    todo = [(op, r) for op, r in zip(ops, rows) if "_todo" in r]
    t0 = time.perf_counter()
    with console.status(f"compiling {len(todo)} ops for sm_90 in {args.jobs} processes"):
        compiled = ops_config_resources([r["_todo"] for _, r in todo], workers=args.jobs)
    console.print(f"compiled in {time.perf_counter() - t0:.0f} s", markup=False)
    with Progress(console=console) as bar:
        task = bar.add_task("timing", total=len(todo))
        for (op, r), res in zip(todo, compiled):
            bar.update(task, description=op.qualname)
            finish(op, r, res)
            console.print(f"{r['op']}: {r.get('variant', '-')}"
                          + (f" {r['median_ms'] * 1e3:.1f} us" if r.get("median_ms") else ""),
                          r.get("error", "ok")[:120], markup=False)
            if args.json_path:  # after every op, so that a run cut short keeps what it measured
                write(args.json_path, device, rows)
            bar.advance(task)
    if args.json_path:
        write(args.json_path, device, rows)
    table = Table(title=f"opforge profile, every op ({device})")
    for col in ("op", "variant", "kernels", "regs", "spills", "smem KiB", "occupancy (limiter)", "µs", "status"):
        table.add_column(col)
    for r in rows:
        ks = r.get("kernels", [])
        table.add_row(r["op"], r.get("variant", "-"), str(len(ks)),
                      "/".join(str(k.get("registers")) for k in ks), "/".join(str(k["spill_stores"]) for k in ks),
                      "/".join(f"{k.get('shared_bytes', 0) / 1024:.0f}" for k in ks),
                      "/".join(f"{k['occupancy']:.2f} ({k['limiter']})" for k in ks),
                      f"{r['median_ms'] * 1e3:.1f}" if r.get("median_ms") else "-",
                      "ok" if "error" not in r else r["error"][:60])
    console.print(table)
    failed = [r for r in rows if "error" in r]
    print(f"{len(rows) - len(failed)}/{len(rows)} ops profiled")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""``opforge demo``: a short tour on whatever device is here."""

from __future__ import annotations

import os

import torch
from rich.console import Console

import opforge
from opforge import doctor
from opforge.bench import harness
from opforge.runtime import device as devmod


def placement_step(console: Console, out_dir: str) -> bool:
    """A short placement-driver simulation: a 4th GPU worker joins 3 loaded ones."""
    from dataclasses import replace

    from opforge.placement.simulator import runner
    from opforge.placement.simulator.cases import AddStore, RegionSpec, round_robin
    from opforge.placement.simulator.cases.add_nodes import CASE, _store

    case = replace(CASE, name="demo-scale-out", description="3 -> 4 stores, 600 regions of 32 MiB",
                   regions=RegionSpec(count=600, replicas=3, size_mib=32, placement=round_robin),
                   events=[AddStore(0, _store(4))], max_ticks=600)
    os.makedirs(out_dir, exist_ok=True)
    plot = os.path.join(out_dir, "placement-scale-out.png")
    result = runner.run_case(case, plot=plot)
    console.print(runner.table([result]))
    console.print(f"per-store counts over time: {plot}")
    return result.passed


def sql_step(console: Console, out_dir: str, device: torch.device, numbers=(1, 3, 6)) -> bool:
    """TPC-H at scale factor 0.01: generate it (tpchgen-cli), run a few queries,
    show a plan, the timings, and whether DuckDB gives the same answers."""
    import shutil
    import sys
    import time

    from opforge.sql.tpch import compare, data, queries

    if not (shutil.which("tpchgen-cli") or os.path.exists(os.path.join(os.path.dirname(sys.executable),
                                                                       "tpchgen-cli"))):
        console.print("[yellow]tpchgen-cli is not installed (pip install tpchgen-cli): SQL step skipped[/yellow]")
        return False
    paths = data.generate(0.01, root=os.path.join(out_dir, "tpch"))
    con = opforge.connect(device=device)
    for name, path in paths.items():
        con.register(name, str(path))
    try:
        from opforge.sql.tpch import reference

        duck = reference.connect(paths)[0]
    except ImportError:
        duck = None
    all_equal = True
    for n in numbers:
        text = queries.query(n)
        start = time.perf_counter()
        ours = con.sql(text).to_arrow()
        ms = (time.perf_counter() - start) * 1e3
        verdict = ""
        if duck is not None:
            keys = compare.order_keys(text)
            same = not compare.compare(ours, reference.run(duck, text), ordered=keys is not None, order_by=keys)
            all_equal &= same
            verdict = ", same answer as DuckDB" if same else ", [red]differs from DuckDB[/red]"
        console.print(f"TPC-H {queries.name(n)}: {ours.num_rows} rows in {ms:.1f} ms on {device}{verdict}")
    console.print(f"plan of {queries.name(numbers[1])}:")
    console.print(con.sql(queries.query(numbers[1])).explain(), markup=False)
    return all_equal


def fusion_step(console: Console, x: torch.Tensor, bias: torch.Tensor) -> float:
    """``opforge.fuse``: a Python function of elementwise ops becomes one kernel."""
    def scaled_bias_gelu(x, b, s):
        return torch.nn.functional.gelu(x + b) * s + torch.tanh(x)

    fused = opforge.fuse(scaled_bias_gelu)
    out = fused(x, bias, 0.5)
    ref = scaled_bias_gelu(x.double(), bias.double(), 0.5)
    err = float((out.double() - ref).norm() / ref.norm())
    lines = len(fused.source(x, bias, 0.5).splitlines())
    console.print(f"\n[bold]opforge.fuse[/bold]: gelu(x + b) * s + tanh(x) as one generated Triton kernel "
                  f"({lines} lines of source, `fused.source(...)`); rel err vs float64 {err:.1e}")
    return err


def stream_step(console: Console, device: torch.device, events: int = 200_000) -> bool:
    """Nexmark q7 (the highest bids of each 10 s tumbling window) on the stream
    engine, bids made in device memory; checked against plain Python over the
    same generated bids."""
    import time

    from opforge.stream import StreamExecutionEnvironment
    from opforge.stream.nexmark import NexmarkConfig, generate, q7

    config = NexmarkConfig(events=events, events_per_second=10_000, max_out_of_orderness_ms=500)
    env = StreamExecutionEnvironment(device=device, batch_size=32_768)
    sink = q7(env, config).collect()
    start = time.perf_counter()
    env.execute("nexmark q7")
    seconds = time.perf_counter() - start
    got = sink.records()
    top: dict = {}
    bids = generate(config, "bid", 0, config.events, "cpu").records()
    for b in bids:
        w = b["date_time"] - b["date_time"] % 10_000
        top[w] = max(top.get(w, b["price"]), b["price"])
    want = [b for b in bids if b["price"] == top[b["date_time"] - b["date_time"] % 10_000]]
    same = sorted(got, key=repr) == sorted(want, key=repr)
    for r in sorted(got, key=lambda r: r["date_time"])[:3]:
        console.print(f"  window {r['date_time'] - r['date_time'] % 10_000:>7} ms: auction {r['auction']}, "
                      f"price {r['price']}, bidder {r['bidder']}")
    verdict = "same answer as plain Python" if same else "[red]differs from plain Python[/red]"
    console.print(f"Nexmark q7: {len(bids):,} bids -> {len(got)} top bids in {seconds * 1000:.0f} ms on {device} "
                  f"({len(bids) / seconds:,.0f} events/s, first call included); {verdict}")
    return same


def run(console: Console | None = None, out_dir: str = "demo-output") -> dict:
    console = console or Console()
    console.rule("opforge demo")
    doctor.run(console)
    dev = devmod.default_device()
    console.print(f"\n[bold]device:[/bold] {devmod.device_info(dev).name} ({dev})")
    x = torch.randn(512, 384, device=dev, dtype=torch.bfloat16)
    bias = torch.randn(384, device=dev, dtype=torch.bfloat16)
    y = opforge.gelu(opforge.add(x, bias))
    ref = torch.nn.functional.gelu(x.double() + bias.double())
    err = float((y.double() - ref).norm() / ref.norm())
    console.print(f"gelu(x + bias) on {tuple(x.shape)} bf16: rel err vs float64 {err:.1e}")
    console.print("\n[bold]dispatch decisions[/bold] (opforge.explain):")
    for name, args in (("add", (x, bias)), ("gelu", (x,)), ("mul", (x.t(), 2.0)), ("softmax", (x, 0))):
        console.print(str(opforge.explain(name, *args)))
    fusion_step(console, x, bias)
    console.print("\n[bold]a small benchmark[/bold] (quick grid):")
    result = harness.run(quick=True, crossover=False, host=True, console=console)
    harness.report(result, console)
    console.print("\n[bold]SQL[/bold]: TPC-H at scale factor 0.01")
    sql_step(console, out_dir, dev)
    console.print("\n[bold]streams[/bold]: Nexmark q7, highest bid per 10 s tumbling window")
    stream_step(console, dev)
    console.print("\n[bold]the placement driver[/bold]: scale-out from 3 to 4 GPU workers (simulated)")
    placement_step(console, out_dir)
    return result

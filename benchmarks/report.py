"""Render a bench JSON (benchmarks/results/*.json) as the Markdown tables of BENCHMARKS.md.

    python benchmarks/report.py benchmarks/results/h200-2026-11-29.json > BENCHMARKS.md
    python benchmarks/report.py --rows benchmarks/results/h200-2026-11-30-attention.json

``--rows`` prints only the entries' table, with a column per peer found in
the file (attention's SDPA backends, GEMM's cuBLAS calls) and both rates.
"""

from __future__ import annotations

import json
import sys


def _ratio(entry: dict, peer: str) -> str:
    p = entry["peers"].get(peer) or {}
    return f"{p['ratio']:.2f}×" if p.get("ratio") else "-"


def render(r: dict) -> str:
    c = r["ceilings"]
    lines = [
        "# opforge benchmarks",
        "",
        f"Measured by `opforge bench` on **{r['gpu']}** ({r['sm_count']} SMs, {r['capability']}), driver "
        f"{r['driver']}, torch {r['torch']}, triton {r['triton']}, opforge {r['opforge']}, on {r['date']}. "
        "Raw figures: the JSON beside this table in `benchmarks/results/`; pictures: the roofline and "
        "crossover PNGs there.",
        "",
        f"Ceilings measured in the same run: copy **{c['copy_tbps']:.2f} TB/s**, bf16 matmul "
        f"**{c['bf16_tflops']:.0f} TFLOP/s** ({c['method']}).",
        "",
        "`variant` is what dispatch ran; `% roof` is the floor time (counted bytes and FLOPs at the "
        "ceilings) over the measured time; `vs X` is X's time over ours (above 1 means opforge is faster). "
        "Times are medians of CUDA-event repeats with L2 flushed; `(graph)` rows are CUDA-graph replays "
        "on both sides.",
        "",
        "| op | variant | dtype | shape | µs | TB/s | % roof | rel err | vs eager | vs compile |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for e in r["entries"]:
        if "error" in e:
            lines.append(f"| {e['op']} | - | - | {e['shape']} | error | | | | | |")
            continue
        shape = e["shape"] + (" (graph)" if e.get("graph_timed") else "")
        lines.append(
            f"| {e['op'].split('::')[1]} | {e['variant']} | {e['dtype']} | {shape} | {e['median_ms'] * 1e3:.1f} | "
            f"{e['tbps']:.2f} | {e['pct_roofline']:.0f} | {e['max_rel_err']:.1e} | {_ratio(e, 'torch eager')} | "
            f"{_ratio(e, 'torch.compile')} |"
        )
    if r.get("crossover_summary"):
        lines += [
            "",
            "## Variant crossover (each variant forced; µs per call)",
            "",
            "A call costs the slower of the GPU time and the host's launch time, so on small tensors the "
            "launcher decides: torch's C++ launch beats Triton's Python launcher. Dispatch follows these "
            "measurements through the tuned table shipped in the package (`opforge tune --preset elementwise`).",
            "",
            "| layout | shape | fastest | " + " | ".join(sorted({k for x in r["crossover_summary"] for k in x["all_ms"]}))
            + " |",
        ]
        names = sorted({k for x in r["crossover_summary"] for k in x["all_ms"]})
        lines.append("|---|---|---|" + "---:|" * len(names))
        for x in r["crossover_summary"]:
            cells = [f"{x['all_ms'][n] * 1e3:.1f}" if n in x["all_ms"] else "-" for n in names]
            lines.append(f"| {x['layout']} | {x['shape']} | {x['fastest']} | " + " | ".join(cells) + " |")
    d = r.get("dispatch_overhead")
    if d:
        lines += [
            "",
            "## Host costs",
            "",
            f"- Dispatch overhead: **{d['dispatch_overhead_us']:.2f} µs** per call on top of running the chosen "
            f"variant directly ({d['variant']}: {d['variant_direct_us']:.2f} µs; `opforge.add` "
            f"{d['opforge_call_us']:.2f} µs; `torch.add` {d['torch_eager_call_us']:.2f} µs), target < 10 µs.",
        ]
    f = r.get("first_call")
    if f and "error" not in f:
        lines.append(
            f"- First call in a fresh process with empty caches: import {f['import_s']:.2f} s; `opforge.gelu` on "
            f"3000×1000 bf16 ({f['first_call_variant']}, from the shipped table) {f['first_call_s'] * 1e3:.0f} ms, "
            f"then {f['second_call_s'] * 1e3:.2f} ms; with `triton_flat` forced, the first call (JIT compile) "
            f"{f['triton_first_call_s'] * 1e3:.0f} ms, then {f['triton_second_call_s'] * 1e3:.2f} ms; warm-up of all "
            f"{f['warmup_configs']} configs of one op in parallel threads: {f['warmup_wall_s']:.2f} s wall."
        )
    return "\n".join(lines) + "\n"


def rows(r: dict) -> str:
    """The entries as one table: both rates and a ``vs`` column per peer."""
    peers = list(dict.fromkeys(p for e in r["entries"] if "error" not in e for p in e["peers"]))
    lines = ["| op | variant | dtype | shape | µs | TB/s | TFLOP/s | % roof | rel err | "
             + " | ".join(f"vs {p}" for p in peers) + " |",
             "|---|---|---|---|---:|---:|---:|---:|---:|" + "---:|" * len(peers)]
    for e in r["entries"]:
        if "error" in e:
            lines.append(f"| {e['op'].split('::')[1]} | - | - | {e['shape']} | error: {e['error'][:80]} |"
                         + " |" * (4 + len(peers)))
            continue
        shape = e["shape"] + (" (graph)" if e.get("graph_timed") else "")
        lines.append(
            f"| {e['op'].split('::')[1]} | {e['variant']} | {e['dtype']} | {shape} | {e['median_ms'] * 1e3:.1f} | "
            f"{e['tbps']:.2f} | {e['tflops']:.1f} | {e['pct_roofline']:.0f} | {e['max_rel_err']:.1e} | "
            + " | ".join(_ratio(e, p) for p in peers) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    only_rows = sys.argv[1] == "--rows"
    with open(sys.argv[-1]) as fh:
        result = json.load(fh)
    sys.stdout.write(rows(result) if only_rows else render(result))

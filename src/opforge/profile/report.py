"""The profile report: one JSON schema, terminal tables, a PNG and an HTML page.

A report is a dict (``validate`` checks its shape). Its ``rows`` are what is
compared: the configs of one op (``kind: "op"``, the chosen one flagged) or
the steps of an example ladder (``kind: "ladder"``). Each row carries its
kernels' compiled resources and theoretical occupancy, its measured time,
bandwidth and place under the roofline when a GPU timed it, and, after an
ncu run, Nsight Compute's figures for its kernels (``opforge.profile.ncu.fold``).

The PNG has three panels: occupancy per row beside the achieved share of
copy bandwidth (where more occupancy stops paying), the roofline (or, for
ops counted without FLOPs, bandwidth against the copy ceiling), and the ncu
figures that explain a row (bank conflicts, sectors per request, stalls).
The HTML page embeds the PNG and the tables, and needs nothing else.
"""

from __future__ import annotations

import base64
import html
import io
import json
import time
from dataclasses import asdict
from pathlib import Path

SCHEMA_VERSION = 1
KINDS = ("op", "ladder")
REPORT_KEYS = {"schema_version": int, "kind": str, "title": str, "date": str, "device": dict, "versions": dict,
               "limits": dict, "limits_source": str, "ceilings": (dict, type(None)), "rows": list,
               "ncu_error": (str, type(None)), "notes": list}
ROW_KEYS = {"label": str, "description": str, "config": dict, "chosen": bool, "kernels": list,
            "occupancy": (float, int, type(None)), "median_ms": (float, type(None)), "tbps": (float, type(None)),
            "tflops": (float, type(None)), "pct_copy_bw": (float, type(None)),
            "pct_roofline": (float, type(None)), "ncu": (list, type(None)), "error": str,
            "correct": (bool, type(None))}
KERNEL_KEYS = ("kernel", "registers", "spill_stores", "spill_loads", "shared_bytes", "num_warps", "num_stages",
               "occupancy")


# ---------------------------------------------------------------------------
# building
# ---------------------------------------------------------------------------
def device_facts() -> tuple[dict, dict, str]:
    """(device, limits, limits_source): the CUDA device's when there is one,
    else Hopper's defaults (the kernels are compiled for sm_90 either way)."""
    import torch

    from opforge.profile.occupancy import Limits
    from opforge.runtime import device as devmod

    if torch.cuda.is_available():
        info = devmod.device_info(devmod.default_device())
        dev = {"type": "cuda", "name": info.name, "capability": info.arch, "sm_count": info.sm_count}
        return dev, asdict(Limits.from_device()), "device properties (allocation units: Hopper's)"
    return ({"type": "cpu", "name": "no CUDA device", "capability": "sm_90 (compile target)", "sm_count": 0},
            asdict(Limits()), "Hopper (sm_90) defaults: no CUDA device here")


def _versions() -> dict:
    from opforge.runtime import device as devmod

    return devmod.versions()


def make_row(label: str, *, description: str = "", config: dict | None = None, chosen: bool = False,
             kernels: list | None = None, median_ms: float | None = None, nbytes: float | None = None,
             flops: float | None = None, ceilings: dict | None = None, ncu: list | None = None,
             error: str = "", correct: bool | None = None, layout: dict | None = None) -> dict:
    """One comparable row; derived rates from ``median_ms``, ``nbytes``, ``flops``; ``layout``:
    the access analyzer's prediction for kernels that declare their layouts."""
    kernels = [k if isinstance(k, dict) else k.to_dict() for k in (kernels or [])]
    occ = [k["occupancy"]["occupancy"] for k in kernels]
    row = {"label": label, "description": description, "config": _plain(config or {}), "chosen": bool(chosen),
           "kernels": kernels, "occupancy": min(occ) if occ else None, "median_ms": _f(median_ms),
           "tbps": None, "tflops": None, "pct_copy_bw": None, "pct_roofline": None, "ncu": ncu,
           "error": error, "correct": correct, "layout": layout}
    if median_ms:
        s = median_ms * 1e-3
        row["tbps"] = float(nbytes / s / 1e12) if nbytes else None
        row["tflops"] = float(flops / s / 1e12) if flops else None
        if ceilings and nbytes:
            row["pct_copy_bw"] = 100.0 * row["tbps"] / ceilings["copy_tbps"]
            floor = max(nbytes / (ceilings["copy_tbps"] * 1e12), (flops or 0) / (ceilings["bf16_tflops"] * 1e12))
            row["pct_roofline"] = 100.0 * floor / s
    return row


def _f(x):
    return None if x is None else float(x)


def _plain(d: dict) -> dict:
    return {k: v if isinstance(v, (int, float, str, bool)) or v is None else str(v) for k, v in d.items()}


def new_report(kind: str, title: str, rows: list[dict], *, ceilings: dict | None = None, notes=(),
               ncu_error: str | None = None, **extra) -> dict:
    if kind not in KINDS:
        raise ValueError(f"report kind must be one of {KINDS}, got {kind!r}")
    dev, limits, source = device_facts()
    rep = {"schema_version": SCHEMA_VERSION, "kind": kind, "title": title,
           "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "device": dev, "versions": _versions(),
           "limits": limits, "limits_source": source, "ceilings": ceilings, "rows": rows,
           "ncu_error": ncu_error, "notes": list(notes)}
    rep.update(extra)
    validate(rep)
    return rep


def op_report(decision, sweep_result, *, kernels=None, ncu_rows: list | None = None, ncu_error: str | None = None,
              args_desc: str = "", notes=()) -> dict:
    """The report of ``opforge profile OP``: the decision, and one row per swept config
    (``kernels`` alone when there was no sweep)."""
    rows = []
    if sweep_result is not None:
        for r in sweep_result.rows:
            rows.append(make_row(_config_label(r.config), config=r.config, chosen=r.chosen, kernels=r.kernels,
                                 median_ms=r.median_ms, nbytes=sweep_result.nbytes, flops=sweep_result.flops,
                                 ceilings=sweep_result.ceilings, error=r.error,
                                 ncu=ncu_rows if r.chosen else None))
    else:
        rows.append(make_row(_config_label(decision.config), config=decision.config, chosen=True,
                             kernels=kernels or [], ncu=ncu_rows))
    rows.sort(key=lambda r: (r["occupancy"] is None, r["occupancy"] or 0.0, not r["chosen"]))
    notes = list(notes)
    extra = {"op": decision.op.qualname, "args": args_desc, "variant": decision.variant.name,
             "decision": str(decision), "source": decision.source}
    if sweep_result is not None:
        from opforge.profile.sweep import occupancy_pays

        extra.update(nbytes=sweep_result.nbytes, flops=sweep_result.flops, flops_assumed=sweep_result.flops_assumed,
                     occupancy_pays=occupancy_pays(sweep_result))
        if sweep_result.flops_assumed:
            notes.append("FLOPs assumed: one per output element (pass --flops for the op's count)")
        if not sweep_result.timed:
            notes.append("no CUDA device: compiled resources and theoretical occupancy only, no times")
    return new_report("op", f"opforge profile {decision.op.qualname} {args_desc}".strip(), rows,
                      ceilings=sweep_result.ceilings if sweep_result is not None else None, notes=notes,
                      ncu_error=ncu_error, **extra)


def _config_label(cfg: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in cfg.items()) or "{}"


def validate(rep: dict) -> None:
    """Raise ValueError naming every key of the schema that is missing or mistyped."""
    bad = []
    for key, typ in REPORT_KEYS.items():
        if key not in rep:
            bad.append(f"missing {key}")
        elif not isinstance(rep[key], typ):
            bad.append(f"{key} is {type(rep[key]).__name__}")
    if rep.get("kind") not in KINDS:
        bad.append(f"kind {rep.get('kind')!r} not in {KINDS}")
    for i, row in enumerate(rep.get("rows") or []):
        for key, typ in ROW_KEYS.items():
            if key not in row:
                bad.append(f"rows[{i}] missing {key}")
            elif not isinstance(row[key], typ):
                bad.append(f"rows[{i}].{key} is {type(row[key]).__name__}")
        for j, k in enumerate(row.get("kernels") or []):
            miss = [x for x in KERNEL_KEYS if x not in k]
            if miss:
                bad.append(f"rows[{i}].kernels[{j}] missing {miss}")
    if bad:
        raise ValueError("opforge profile report does not match schema v1: " + "; ".join(bad))


# ---------------------------------------------------------------------------
# terminal
# ---------------------------------------------------------------------------
def _fmt(x, spec=".3g", none="-"):
    return none if x is None else format(x, spec)


def tables(rep: dict) -> list:
    """Rich tables: per-row figures, per-kernel resources, ncu figures."""
    from rich.table import Table

    dev = rep["device"]
    t = Table(title=f"{rep['title']} — {dev['name']} ({dev['capability']})")
    for col in ("", "row", "occupancy", "limiter", "µs", "TB/s", "% copy BW", "% roofline", "note"):
        t.add_column(col, justify="left" if col in ("", "row", "limiter", "note") else "right")
    for r in rep["rows"]:
        limiter = ", ".join(sorted({k["occupancy"]["limiter"] for k in r["kernels"]})) or "-"
        note = r["error"][:60] if r["error"] else ("" if r["correct"] is None else ("ok" if r["correct"] else "WRONG"))
        t.add_row("▶" if r["chosen"] else "", r["label"], _fmt(r["occupancy"], ".0%"), limiter,
                  _fmt(r["median_ms"] and r["median_ms"] * 1e3, ".1f"), _fmt(r["tbps"]),
                  _fmt(r["pct_copy_bw"], ".0f"), _fmt(r["pct_roofline"], ".0f"), note)
    k = Table(title="compiled resources (sm_90)")
    for col in ("row", "kernel", "regs", "spill st/ld B", "smem B", "warps", "stages", "blocks/SM", "limiter"):
        k.add_column(col, justify="left" if col in ("row", "kernel", "limiter") else "right")
    for r in rep["rows"]:
        for kr in r["kernels"]:
            k.add_row(r["label"], kr["kernel"].rsplit(":", 1)[-1], str(kr["registers"]),
                      f"{kr['spill_stores']}/{kr['spill_loads']}", str(kr["shared_bytes"]), str(kr["num_warps"]),
                      str(kr["num_stages"]), str(kr["occupancy"]["blocks_per_sm"]), kr["occupancy"]["limiter"])
    out = [t, k]
    if any(r["ncu"] for r in rep["rows"]):
        n = Table(title="Nsight Compute (--clock-control none)")
        for col in ("row", "kernel", "DRAM %", "TB/s", "achieved occ %", "bank conf ld/st", "sect/req ld/st",
                    "top stalls"):
            n.add_column(col, justify="left" if col in ("row", "kernel", "top stalls") else "right")
        for r in rep["rows"]:
            for m in r["ncu"] or []:
                n.add_row(r["label"], m["kernel"], _fmt(m["dram_throughput_pct"], ".0f"), _fmt(m["dram_tbps"]),
                          _fmt(m["achieved_occupancy_pct"], ".0f"),
                          f"{_fmt(m['shared_bank_conflicts_ld'], '.0f')}/{_fmt(m['shared_bank_conflicts_st'], '.0f')}",
                          f"{_fmt(m['global_ld_sectors_per_request'], '.2f')}/"
                          f"{_fmt(m['global_st_sectors_per_request'], '.2f')}",
                          ", ".join(f"{s} {m['stall_shares'][s]:.0%}" for s in m["top_stalls"]))
        out.append(n)
    if any(r.get("layout") for r in rep["rows"]):
        out.append(_layout_table(rep))
    return out


def _layout_table(rep: dict):
    """opforge.layout's prediction per memory instruction of one program (per warp request)."""
    from rich.table import Table

    t = Table(title="predicted by opforge.layout (per warp request)")
    for col in ("row", "access", "space", "B/lane", "requests", "wavefronts", "conflicts", "sectors", "lines"):
        t.add_column(col, justify="left" if col in ("row", "access", "space") else "right")
    for r in rep["rows"]:
        for a in (r.get("layout") or {}).get("accesses", []):
            n = a["requests"] or 1
            per = {k: _fmt(a[k] / n, ".2f") if k in a else "-" for k in ("wavefronts", "conflicts", "sectors", "lines")}
            t.add_row(r["label"], a["name"], f"{a['space']} {a['op']}", str(a["width"]), str(a["requests"]),
                      per["wavefronts"], per["conflicts"], per["sectors"], per["lines"])
    return t


def print_report(rep: dict, console) -> None:
    if rep.get("decision"):
        console.print(rep["decision"], markup=False)
    for t in tables(rep):
        console.print(t)
    pays = rep.get("occupancy_pays")
    if pays:
        console.print(f"more occupancy stops paying at {pays['occupancy']:.0%}: {_config_label(pays['config'])} "
                      f"reaches {pays['tbps']:.3g} TB/s, within {pays['tolerance']:.0%} of the best "
                      f"{pays['best_tbps']:.3g} TB/s", markup=False)
    if rep["ncu_error"]:
        console.print(f"ncu: {rep['ncu_error']}", style="yellow", markup=False)
    for note in rep["notes"]:
        console.print(f"note: {note}", markup=False)


# ---------------------------------------------------------------------------
# files
# ---------------------------------------------------------------------------
def write_json(rep: dict, path: str | Path) -> Path:
    validate(rep)
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(rep, indent=1, default=str) + "\n")
    return p


def figure(rep: dict):
    """The report's matplotlib figure (see the module docstring)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = rep["rows"]
    has_ncu = any(r["ncu"] for r in rows)
    fig, axes = plt.subplots(1, 3 if has_ncu else 2, figsize=(17 if has_ncu else 12, 5))
    labels = [r["label"] if len(r["label"]) <= 28 else r["label"][:26] + "…" for r in rows]
    xs = list(range(len(rows)))

    # occupancy vs row, with achieved bandwidth
    ax = axes[0]
    occ = [100 * (r["occupancy"] or 0) for r in rows]
    bars = ax.bar(xs, occ, color=["#d62728" if r["chosen"] else "#1f77b4" for r in rows], alpha=0.75,
                  label="theoretical occupancy %")
    ach = [next((m["achieved_occupancy_pct"] for m in (r["ncu"] or []) if m["achieved_occupancy_pct"]), None)
           for r in rows]
    if any(a is not None for a in ach):
        ax.scatter([x for x, a in zip(xs, ach) if a is not None], [a for a in ach if a is not None], marker="D",
                   color="black", zorder=3, label="achieved occupancy % (ncu)")
    for b, r in zip(bars, rows):
        lim = ",\n".join(sorted({k["occupancy"]["limiter"] for k in r["kernels"]}))
        ax.text(b.get_x() + b.get_width() / 2, b.get_height() + 1, lim, ha="center", fontsize=6)
    ax.set_ylim(0, 115)
    ax.set_ylabel("occupancy % (label: limiter)")
    ax.set_xticks(xs)
    ax.set_xticklabels(labels, rotation=35, ha="right", fontsize=7)
    timed = [r for r in rows if r["pct_copy_bw"] is not None]
    if timed:
        ax2 = ax.twinx()
        ax2.plot([x for x, r in zip(xs, rows) if r["pct_copy_bw"] is not None],
                 [r["pct_copy_bw"] for r in timed], "o-", color="#2ca02c", label="% of copy bandwidth")
        ax2.set_ylabel("% of copy bandwidth", color="#2ca02c")
        ax2.set_ylim(0, max(110, max(r["pct_copy_bw"] for r in timed) * 1.1))
        ax2.legend(loc="upper right", fontsize=7)
        ax.set_title("occupancy vs bandwidth: where more occupancy stops paying", fontsize=9)
    else:
        ax.set_title("theoretical occupancy per row (no GPU times)", fontsize=9)
    ax.legend(loc="upper left", fontsize=7)

    # roofline
    ax = axes[1]
    c = rep["ceilings"]
    flops_rows = [r for r in rows if r["tflops"] and r["tbps"]]
    if c and flops_rows:
        bw, peak = c["copy_tbps"], c["bf16_tflops"]
        ints = [r["tflops"] / r["tbps"] for r in flops_rows]
        lo, hi = min(ints + [0.05]) / 4, max(ints + [peak / bw * 4]) * 4
        grid = [lo * (hi / lo) ** (i / 200) for i in range(201)]
        ax.plot(grid, [min(peak, g * bw) for g in grid], "k-", lw=2, label=f"roof {bw:.2f} TB/s, {peak:.0f} TFLOP/s")
        for r, i in zip(flops_rows, ints):
            ax.scatter(i, r["tflops"], s=60 if r["chosen"] else 30, marker="*" if r["chosen"] else "o",
                       label=r["label"][:30])
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("arithmetic intensity (FLOP/byte)")
        ax.set_ylabel("TFLOP/s")
        ax.set_title("roofline (measured ceilings)" + (" — FLOPs assumed" if rep.get("flops_assumed") else ""),
                     fontsize=9)
        ax.legend(fontsize=6, loc="lower right")
    elif c and timed:
        ax.bar(xs, [r["tbps"] or 0 for r in rows], color="#2ca02c", alpha=0.8)
        ax.axhline(c["copy_tbps"], color="black", lw=2, label=f"copy ceiling {c['copy_tbps']:.2f} TB/s")
        ax.set_xticks(xs)
        ax.set_xticklabels(labels, rotation=35, ha="right", fontsize=7)
        ax.set_ylabel("achieved TB/s")
        ax.set_title("bandwidth against the copy ceiling (memory-bound roofline)", fontsize=9)
        ax.legend(fontsize=7)
    else:
        regs = [max([k["registers"] for k in r["kernels"]] or [0]) for r in rows]
        ax.bar(xs, regs, color="#9467bd", alpha=0.8, label="registers / thread (max over kernels)")
        spills = [sum(k["spill_stores"] + k["spill_loads"] for k in r["kernels"]) for r in rows]
        if any(spills):
            ax.bar(xs, spills, color="#d62728", alpha=0.8, label="spill bytes")
        ax.set_xticks(xs)
        ax.set_xticklabels(labels, rotation=35, ha="right", fontsize=7)
        ax.set_title("registers per row (no GPU: no roofline placement)", fontsize=9)
        ax.legend(fontsize=7)

    if has_ncu:
        ax = axes[2]
        first = [(r["ncu"] or [{}])[0] for r in rows]
        w = 0.25
        conf = [(m.get("shared_bank_conflicts_ld") or 0) + (m.get("shared_bank_conflicts_st") or 0) for m in first]
        ld = [m.get("global_ld_sectors_per_request") or 0 for m in first]
        st = [m.get("global_st_sectors_per_request") or 0 for m in first]
        ax.bar([x - w for x in xs], ld, w, label="global ld sectors/request")
        ax.bar(xs, st, w, label="global st sectors/request")
        ax.set_ylabel("sectors per request (coalesced: warp bytes / 32)")
        ax3 = ax.twinx()
        ax3.bar([x + w for x in xs], conf, w, color="#d62728", alpha=0.7, label="shared bank conflicts (ld+st)")
        ax3.set_ylabel("bank conflicts", color="#d62728")
        for x, m in zip(xs, first):
            if m.get("top_stalls"):
                ax.text(x, 0.2, "\n".join(m["top_stalls"][:2]), ha="center", fontsize=6, rotation=90)
        ax.set_xticks(xs)
        ax.set_xticklabels(labels, rotation=35, ha="right", fontsize=7)
        ax.set_title("Nsight Compute: coalescing, bank conflicts, top stalls", fontsize=9)
        ax.legend(loc="upper left", fontsize=6)
        ax3.legend(loc="upper right", fontsize=6)
    dev = rep["device"]
    fig.suptitle(f"{rep['title']} — {dev['name']} ({rep['date']})", fontsize=10)
    fig.tight_layout()
    return fig


def write_png(rep: dict, path: str | Path) -> Path:
    import matplotlib.pyplot as plt

    fig = figure(rep)
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p


def _png_bytes(rep: dict) -> bytes:
    import matplotlib.pyplot as plt

    fig = figure(rep)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def render_html(rep: dict) -> str:
    """A self-contained page: headline, the figure (embedded PNG), the tables."""
    validate(rep)
    e = html.escape
    dev = rep["device"]
    png = base64.b64encode(_png_bytes(rep)).decode()
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>{e(rep['title'])}</title>",
        "<style>body{font-family:system-ui,sans-serif;margin:2em;max-width:1400px}"
        "table{border-collapse:collapse;margin:1em 0;font-size:13px}"
        "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}td:first-child,th:first-child{text-align:left}"
        ".chosen{background:#fde8e8}.note{color:#555}.err{color:#b00}</style></head><body>",
        f"<h1>{e(rep['title'])}</h1>",
        f"<p>{e(dev['name'])} ({e(dev['capability'])}, {dev['sm_count']} SMs) — {e(rep['date'])} — torch "
        f"{e(rep['versions'].get('torch', ''))}, triton {e(rep['versions'].get('triton', ''))}. "
        f"Occupancy limits: {e(rep['limits_source'])}.</p>",
    ]
    if rep.get("decision"):
        parts.append(f"<pre>{e(rep['decision'])}</pre>")
    pays = rep.get("occupancy_pays")
    if pays:
        parts.append(f"<p><b>More occupancy stops paying at {pays['occupancy']:.0%}</b>: "
                     f"{e(_config_label(pays['config']))} reaches {pays['tbps']:.3g} TB/s, within "
                     f"{pays['tolerance']:.0%} of the best {pays['best_tbps']:.3g} TB/s.</p>")
    if rep["ceilings"]:
        c = rep["ceilings"]
        parts.append(f"<p>Ceilings measured on this device: copy {c['copy_tbps']:.2f} TB/s, bf16 "
                     f"{c['bf16_tflops']:.0f} TFLOP/s ({e(c.get('method', ''))}).</p>")
    parts.append(f"<img alt='profile charts' style='max-width:100%' src='data:image/png;base64,{png}'>")
    parts.append("<h2>Rows</h2><table><tr><th>row</th><th>description</th><th>occupancy</th><th>limiter</th>"
                 "<th>µs</th><th>TB/s</th><th>% copy BW</th><th>% roofline</th><th>check</th></tr>")
    for r in rep["rows"]:
        limiter = ", ".join(sorted({k["occupancy"]["limiter"] for k in r["kernels"]})) or "-"
        check = e(r["error"][:120]) if r["error"] else ("" if r["correct"] is None else
                                                         ("ok" if r["correct"] else "<b class='err'>WRONG</b>"))
        parts.append(f"<tr class='{'chosen' if r['chosen'] else ''}'><td>{e(r['label'])}</td>"
                     f"<td style='text-align:left'>{e(r['description'])}</td><td>{_fmt(r['occupancy'], '.0%')}</td>"
                     f"<td>{e(limiter)}</td><td>{_fmt(r['median_ms'] and r['median_ms'] * 1e3, '.1f')}</td>"
                     f"<td>{_fmt(r['tbps'])}</td><td>{_fmt(r['pct_copy_bw'], '.0f')}</td>"
                     f"<td>{_fmt(r['pct_roofline'], '.0f')}</td><td>{check}</td></tr>")
    parts.append("</table><h2>Compiled resources (sm_90)</h2><table><tr><th>row</th><th>kernel</th><th>regs</th>"
                 "<th>spill st/ld B</th><th>smem B</th><th>warps</th><th>stages</th><th>blocks/SM</th>"
                 "<th>limiter</th></tr>")
    for r in rep["rows"]:
        for k in r["kernels"]:
            parts.append(f"<tr><td>{e(r['label'])}</td><td>{e(k['kernel'])}</td><td>{k['registers']}</td>"
                         f"<td>{k['spill_stores']}/{k['spill_loads']}</td><td>{k['shared_bytes']}</td>"
                         f"<td>{k['num_warps']}</td><td>{k['num_stages']}</td>"
                         f"<td>{k['occupancy']['blocks_per_sm']}</td><td>{e(k['occupancy']['limiter'])}</td></tr>")
    parts.append("</table>")
    if any(r["ncu"] for r in rep["rows"]):
        parts.append("<h2>Nsight Compute (clocks not locked)</h2><table><tr><th>row</th><th>kernel</th>"
                     "<th>DRAM %</th><th>DRAM TB/s</th><th>achieved occ %</th><th>bank conflicts ld/st</th>"
                     "<th>sectors/req ld/st</th><th>stall reasons</th></tr>")
        for r in rep["rows"]:
            for m in r["ncu"] or []:
                stalls = ", ".join(f"{s} {m['stall_shares'][s]:.0%}" for s in m["top_stalls"])
                parts.append(
                    f"<tr><td>{e(r['label'])}</td><td>{e(m['kernel'])}</td><td>{_fmt(m['dram_throughput_pct'], '.0f')}"
                    f"</td><td>{_fmt(m['dram_tbps'])}</td><td>{_fmt(m['achieved_occupancy_pct'], '.0f')}</td>"
                    f"<td>{_fmt(m['shared_bank_conflicts_ld'], '.0f')}/{_fmt(m['shared_bank_conflicts_st'], '.0f')}"
                    f"</td><td>{_fmt(m['global_ld_sectors_per_request'], '.2f')}/"
                    f"{_fmt(m['global_st_sectors_per_request'], '.2f')}</td><td>{e(stalls)}</td></tr>")
        parts.append("</table>")
    if rep["ncu_error"]:
        parts.append(f"<p class='err'>ncu: {e(rep['ncu_error'])}</p>")
    for note in rep["notes"]:
        parts.append(f"<p class='note'>{e(note)}</p>")
    parts.append("</body></html>")
    return "\n".join(parts)


def write_html(rep: dict, path: str | Path) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(render_html(rep))
    return p


def write_all(rep: dict, out_dir: str | Path, stem: str) -> dict[str, Path]:
    """``<stem>.json``, ``<stem>.html`` and ``<stem>.png`` under ``out_dir``."""
    d = Path(out_dir)
    return {"json": write_json(rep, d / f"{stem}.json"), "html": write_html(rep, d / f"{stem}.html"),
            "png": write_png(rep, d / f"{stem}.png")}

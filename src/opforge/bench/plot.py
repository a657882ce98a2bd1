"""Pictures of bench results: the roofline, and the variant crossover."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def roofline_png(result: dict, path: Path | str) -> None:
    """Log-log roofline: each op and each peer as a point under the measured roof."""
    c = result["ceilings"]
    bw, peak = c["copy_tbps"], c["bf16_tflops"]
    fig, ax = plt.subplots(figsize=(9, 6))
    entries = [e for e in result["entries"] if e.get("intensity")]
    lo = min([e["intensity"] for e in entries] + [0.01]) / 3
    hi = max([e["intensity"] for e in entries] + [peak / bw * 10]) * 3
    xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    ax.plot(xs, [min(peak, x * bw) for x in xs], "k-", lw=2, label=f"roof: {bw:.2f} TB/s, {peak:.0f} TFLOP/s")
    markers = {"opforge": "o", "torch eager": "s", "torch.compile": "^"}
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, e in enumerate(entries):
        color = colors[i % len(colors)]
        name = f"{e['op'].split('::')[1]} {e['dtype']} {e['shape']}"
        ax.scatter(e["intensity"], e["tflops"], marker=markers["opforge"], color=color, s=60, label=name)
        for peer, p in e["peers"].items():
            if p.get("median_ms"):
                tf = e["flops"] / (p["median_ms"] * 1e-3) / 1e12
                ax.scatter(e["intensity"], tf, marker=markers.get(peer, "x"), color=color, s=40,
                           facecolors="none")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("TFLOP/s")
    gpu = result.get("gpu", "")
    ax.set_title(f"opforge roofline on {gpu} ({result.get('date', '')}): ● opforge  □ eager  △ compile")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=6, loc="lower right", ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def crossover_png(crossover: list[dict], path: Path | str, title: str) -> None:
    """Median time against size, one line per forced variant, one panel per layout."""
    groups: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for e in crossover:
        layout = (f"{e['op'].split('::')[1]} {e['dtype']}, "
                  + ("transposed a" if "ᵀ" in e["shape"] else "contiguous"))
        groups.setdefault(layout, {}).setdefault(e["variant"], []).append((e["bytes"], e["median_ms"]))
    fig, axes = plt.subplots(1, len(groups), figsize=(6 * len(groups), 4.5), squeeze=False)
    for ax, (layout, lines) in zip(axes[0], sorted(groups.items())):
        for variant, pts in sorted(lines.items()):
            pts.sort()
            ax.plot([p[0] for p in pts], [p[1] * 1e3 for p in pts], "o-", label=variant)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("bytes moved")
        ax.set_ylabel("median µs per call")
        ax.set_title(layout)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)

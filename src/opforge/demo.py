"""``opforge demo``: a short tour on whatever device is here."""

from __future__ import annotations

import torch
from rich.console import Console

import opforge
from opforge import doctor
from opforge.bench import harness
from opforge.runtime import device as devmod


def run(console: Console | None = None) -> dict:
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
    for name, args in (("add", (x, bias)), ("gelu", (x,)), ("mul", (x.t(), 2.0))):
        console.print(str(opforge.explain(name, *args)))
    console.print("\n[bold]a small benchmark[/bold] (quick grid):")
    result = harness.run(quick=True, crossover=False, host=True, console=console)
    harness.report(result, console)
    return result

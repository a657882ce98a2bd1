"""One training step of a Llama-style model, four ways (issue 30's first goal).

    python benchmarks/llm_train_step.py                      # the issue's shape on the GPU, every mode
    python benchmarks/llm_train_step.py --layers 2 --seq 512 --modes eager,opforge
    python benchmarks/llm_train_step.py --out json           # also write benchmarks/results/<gpu>-<date>-llm-train-step.json
    python benchmarks/llm_train_step.py --profile opforge    # one mode's per-kernel CUDA time table (top 45)

The model is built from a config with random weights (no downloads): by
default Llama-3.2-1B's shape, 16 layers, hidden 2048, intermediate 8192, 32 /
8 heads (head dim 64), vocab 128256, tied embeddings; bf16 weights, AdamW
(fused on CUDA), batch 2 x 4096 tokens with ``labels = input_ids``. A step
is forward + loss + backward + optimizer step + zero_grad.

Modes (each in its own process, so that one mode's patching, compile caches
and allocator state never reach another, and peak memory is its own):

* ``eager``: transformers with SDPA attention.
* ``compile``: the same with the model body (``model.model``) under
  ``torch.compile`` (the head and loss eager, as the issue measured).
* ``liger``: Liger-Kernel's ``apply_liger_kernel_to_llama`` (RoPE, RMSNorm,
  SwiGLU, fused linear cross-entropy) when ``liger_kernel`` is installed;
  reported as skipped otherwise.
* ``opforge``: ``opforge.nn.patch(model)``.
* ``opforge_compile``: the patch, then the body under ``torch.compile``.
* ``opforge_sdpa``: the patch without its attention forward (RoPE and
  attention stay transformers' SDPA): against ``opforge``, the share of
  opforge's RoPE + FlashAttention in the step.

Timing: ``--warmup`` steps (compile, autotune caches, allocator), then
``--steps`` steps each timed with CUDA events around the whole step; the
median counts. tokens/s = batch x seq / median step. Peak memory is
``torch.cuda.max_memory_allocated`` over the timed steps (weights, AdamW state,
activations). ``loss0`` is the first step's loss: every mode starts from the
same weights and tokens, so they must agree (to bf16 rounding), which is the
run's correctness check. Prints one line per mode and the ratios to Liger.

``--profile MODE`` runs that one mode's warmup, then profiles ``--steps``
steps with ``torch.profiler`` and prints the top 45 kernels by CUDA time
(total and per step), the kernel time against the wall time of a step, the 15 ops that allocate most and the steps' memory
peak: where a gap to Liger is.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

SCHEMA_VERSION = 1
MODES = ("eager", "compile", "liger", "opforge", "opforge_compile", "opforge_sdpa")
DEFAULT_MODES = MODES[:5]  # opforge_sdpa on request (--modes): a diagnosis, not a peer


def build_model(args, device):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
                      num_hidden_layers=args.layers, num_attention_heads=args.heads,
                      num_key_value_heads=args.kv_heads, head_dim=args.hidden // args.heads,
                      max_position_embeddings=max(args.seq, 8192), tie_word_embeddings=not args.untied,
                      attn_implementation="sdpa", use_cache=False)
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(cfg)
    return model.to(torch.bfloat16 if args.dtype == "bf16" else torch.float32).train()


def apply_mode(mode: str, model):
    """Returns the model to step, or a string saying why the mode cannot run here."""
    import torch

    if mode in ("liger",):
        try:
            from liger_kernel.transformers import apply_liger_kernel_to_llama
        except ImportError as exc:
            return f"liger_kernel is not installed ({exc})"
        apply_liger_kernel_to_llama(rope=True, rms_norm=True, swiglu=True, cross_entropy=False,
                                    fused_linear_cross_entropy=True, model=model)
    if mode.startswith("opforge"):
        import opforge

        print(opforge.nn.patch(model, attention=mode != "opforge_sdpa").report, file=sys.stderr)
    if mode.endswith("compile"):
        model.model.compile()
    return model


def run_child(args) -> dict:
    import torch

    device = torch.device(args.device)
    cuda = device.type == "cuda"
    model = build_model(args, device)
    model = apply_mode(args.mode, model)
    if isinstance(model, str):
        return {"mode": args.mode, "skipped": model}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=cuda)
    g = torch.Generator(device="cpu").manual_seed(1)
    ids = torch.randint(0, args.vocab, (args.batch, args.seq), generator=g).to(device)
    times, loss0 = [], None
    for step in range(args.warmup + args.steps):
        if step == args.warmup and cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        else:
            import time
            t0 = time.perf_counter()
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if cuda:
            end.record()
            torch.cuda.synchronize()
            ms = start.elapsed_time(end)
        else:
            ms = (time.perf_counter() - t0) * 1e3
        if step == 0:
            loss0 = float(loss.detach().float())
        if step >= args.warmup:
            times.append(ms)
    median = statistics.median(times)
    return {"mode": args.mode, "step_ms": median, "step_ms_all": times,
            "tokens_per_s": args.batch * args.seq / (median / 1e3),
            "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None, "loss0": loss0}


def profile_child(args) -> str:
    """The table ``--profile`` prints: the kernels of ``--steps`` steps of one mode, by CUDA time."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    device = torch.device(args.device)
    cuda = device.type == "cuda"
    model = apply_mode(args.mode, build_model(args, device))
    if isinstance(model, str):
        return f"{args.mode}: skipped: {model}"
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=cuda)
    ids = torch.randint(0, args.vocab, (args.batch, args.seq), generator=torch.Generator().manual_seed(1)).to(device)

    def step():
        model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(args.warmup):
        step()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    import time

    with profile(activities=activities, profile_memory=True) as prof:
        start = time.perf_counter()
        for _ in range(args.steps):
            step()
        if cuda:
            torch.cuda.synchronize()
        wall_ms = (time.perf_counter() - start) * 1e3 / args.steps
    key = "self_cuda_time_total" if cuda else "self_cpu_time_total"
    averages = prof.key_averages()
    table = averages.table(sort_by=key, row_limit=45, max_name_column_width=90)
    device_ms = sum(getattr(e, "self_device_time_total" if cuda else key) for e in averages) / 1e3 / args.steps
    memory_key = "self_cuda_memory_usage" if cuda else "self_cpu_memory_usage"
    memory = averages.table(sort_by=memory_key, row_limit=15, max_name_column_width=70)
    peak = f"{torch.cuda.max_memory_allocated() / 2**30:.2f} GiB" if cuda else "n/a"
    return f"mode {args.mode}: {args.steps} steps profiled (divide totals by {args.steps} for one step), " \
           f"peak {peak}; per step: {wall_ms:.1f} ms wall (profiled), {device_ms:.1f} ms of kernel time\n{table}\nthe ops that allocate most (self memory, all steps):\n{memory}"


def versions() -> dict:
    import torch

    out = {"torch": torch.__version__, "gpu": None, "driver": None}
    for name in ("triton", "transformers", "liger_kernel"):
        try:
            out[name] = __import__(name).__version__
        except Exception:  # noqa: BLE001  (not installed, or no version attribute)
            out[name] = None
    if torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name()
        try:
            out["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                           capture_output=True, text=True, check=True).stdout.strip().splitlines()[0]
        except (OSError, subprocess.CalledProcessError, IndexError):
            out["driver"] = None
    return out


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """The model's shape (Llama-3.2-1B's by default), shared with llm_generate.py."""
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--intermediate", type=int, default=8192)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--vocab", type=int, default=128256)
    p.add_argument("--untied", action="store_true", help="separate LM head (default: tied, as Llama-3.2-1B)")
    p.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_arguments(p)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--modes", default=",".join(DEFAULT_MODES))
    p.add_argument("--device", default=None)
    p.add_argument("--out", choices=("json",), default=None, help="also write the JSON under benchmarks/results/")
    p.add_argument("--profile", metavar="MODE", choices=MODES, default=None,
                   help="profile this one mode and print its top 45 kernels by CUDA time")
    p.add_argument("--mode", help=argparse.SUPPRESS)  # a child process: run this one mode, print its JSON
    args = p.parse_args()
    if args.device is None:
        import torch
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.profile:
        args.mode = args.profile
        print(profile_child(args))
        return
    if args.mode:
        print("RESULT " + json.dumps(run_child(args)))
        return
    forwarded = [a for a in sys.argv[1:] if not a.startswith("--out") and a != "json"]
    entries = []
    for mode in args.modes.split(","):
        if mode not in MODES:
            raise SystemExit(f"unknown mode {mode!r}; modes: {', '.join(MODES)}")
        proc = subprocess.run([sys.executable, __file__, *forwarded, "--device", args.device, "--mode", mode],
                              capture_output=True, text=True, env=dict(os.environ))
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
        if line is None:
            entry = {"mode": mode, "error": (proc.stderr or proc.stdout).strip().splitlines()[-5:]}
        else:
            entry = json.loads(line[len("RESULT "):])
        entries.append(entry)
        print(_row(entry), flush=True)
    for e in _with_ratios(entries):
        if "vs_liger" in e:
            print(f"  {e['mode']:16s} {e['vs_liger']['tokens_per_s']:.3f}x Liger tokens/s"
                  + (f", {e['vs_liger']['peak']:.3f}x its peak memory" if e['vs_liger']['peak'] else ""))
    config = {k: getattr(args, k) for k in ("layers", "hidden", "intermediate", "heads", "kv_heads", "vocab",
                                            "batch", "seq", "dtype", "steps", "warmup", "untied")}
    report = {"schema_version": SCHEMA_VERSION, "date": dt.date.today().isoformat(), **versions(),
              "config": config, "entries": entries}
    if args.out == "json":
        gpu = "h200" if "H200" in (report["gpu"] or "") else ("gpu" if report["gpu"] else "cpu")
        path = HERE / "results" / f"{gpu}-{report['date']}-llm-train-step.json"
        report = _merged(path, report)
        path.write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {path}")


def _merged(path: Path, report: dict) -> dict:
    """Modes run in separate calls (a device call has a time limit) land in one file:
    an earlier file of the same config and versions keeps the modes this run did not
    repeat, and the ratios to Liger are recomputed over all of them."""
    if not path.exists():
        return report
    old = json.loads(path.read_text())
    same = all(old.get(k) == report.get(k) for k in ("config", "gpu", "torch", "triton", "transformers"))
    if not same:
        return report
    mine = {e["mode"] for e in report["entries"]}
    entries = [e for e in old["entries"] if e["mode"] not in mine] + report["entries"]
    entries.sort(key=lambda e: MODES.index(e["mode"]))
    return dict(report, entries=_with_ratios(entries))


def _with_ratios(entries: list[dict]) -> list[dict]:
    """Each timed entry's tokens/s and peak memory as ratios to Liger's (when Liger ran)."""
    liger = next((e for e in entries if e["mode"] == "liger" and "tokens_per_s" in e), None)
    for e in entries:
        if liger and "tokens_per_s" in e:
            e["vs_liger"] = {"tokens_per_s": e["tokens_per_s"] / liger["tokens_per_s"],
                             "peak": (e["peak_gib"] / liger["peak_gib"]) if liger["peak_gib"] else None}
    return entries


def _row(e: dict) -> str:
    if "tokens_per_s" in e:
        peak = f"{e['peak_gib']:.1f} GiB peak" if e["peak_gib"] is not None else "peak n/a"
        return f"{e['mode']:16s} {e['tokens_per_s'] / 1e3:8.1f} K tokens/s  {e['step_ms']:9.1f} ms/step  {peak}  " \
               f"loss0 {e['loss0']:.4f}"
    return f"{e['mode']:16s} " + (f"skipped: {e['skipped']}" if "skipped" in e else f"FAILED: {e['error']}")


if __name__ == "__main__":
    main()

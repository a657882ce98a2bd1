"""Greedy generation of a Llama-style model, opforge against transformers (issue 30's third goal).

    python benchmarks/llm_generate.py                                  # batch 1, 8, 64; 2k prompt; 128 new tokens
    python benchmarks/llm_generate.py --batches 8 --modes hf_static_compile,opforge,opforge_paged
    python benchmarks/llm_generate.py --mixed        # requests of mixed lengths (see below)
    python benchmarks/llm_generate.py --out json     # also write benchmarks/results/<gpu>-<date>-llm-generate.json
                                                     # (calls of the same config merge into that file)

The model is the one ``llm_train_step.py`` builds (Llama-3.2-1B's shape by
default, random weights, bf16, eval mode). Each (mode, batch) runs in its own
process (compile caches and peak memory are its own). Modes:

* ``hf_static_compile``: transformers' ``generate`` with SDPA, a static cache
  (``cache_implementation="static"``) and its automatic ``torch.compile`` of
  the decode forward (``CompileConfig()``: mode ``reduce-overhead``, CUDA
  graphs): the issue's peer. It is compiled and warmed by at least two full
  ``generate`` calls before any timed call; the first call's time (the
  compile) is printed and recorded separately (``first_call_s``).
* ``hf_eager``: transformers' ``generate`` with SDPA and its dynamic cache.
* ``opforge``: ``opforge.nn.patch(model)``, then ``opforge.nn.generate``
  (static KV cache, ``attention_decode``, the decode step in a CUDA graph).
* ``opforge_nograph``: the same without the CUDA graph (the graph's share).
* ``opforge_paged``: ``opforge.nn.generate`` on the paged KV cache with
  continuous batching (``max_batch`` = the batch size, one CUDA graph a
  batch-size bucket).

Workloads. Default: every row decodes greedily ``--new`` tokens after a
``--prompt``-token random prompt, no end-of-sequence stop. ``--mixed``: at
batch ``B``, ``2B`` requests whose prompt lengths are drawn from ``[prompt/4,
prompt]`` and new-token budgets from ``[new/4, new]`` (seeded): the paged mode
runs them with at most ``B`` decoding at once (a finished request's row goes
to the next waiting one); transformers serves them as static batches of
``B`` (left-padded to the longest prompt of all, ``max_new_tokens`` the
largest budget: one compiled shape), and only the tokens asked for count.
The static ``opforge`` modes need one prompt length and are skipped.

tokens/s = the new tokens asked for / the whole call (prefill included),
median of ``--repeats`` calls after ``--warmup`` calls (compiles, graph
capture). ``match`` says whether the mode's first 8 new tokens of each row
(mixed: of the first request) equal ``hf_eager``'s (bf16 argmax ties can
differ later; each child recomputes that reference with one short eager
generate). Prints one line per (mode, batch) and the ratios to
``hf_static_compile``.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

from llm_train_step import add_model_arguments, build_model, versions  # noqa: E402  (the same model and version record)

SCHEMA_VERSION = 1
MODES = ("hf_static_compile", "hf_eager", "opforge", "opforge_nograph", "opforge_paged")
STATIC_ONLY = ("opforge", "opforge_nograph")  # one prompt length: not for --mixed
CHILD_TIMEOUT_S = 240
PEER = "hf_static_compile"
CHECK_TOKENS = 8


def _hf_generate(model, ids, new, static: bool, mask=None):
    import torch
    from transformers import CompileConfig

    kwargs = dict(cache_implementation="static", compile_config=CompileConfig()) if static else {}
    mask = torch.ones_like(ids) if mask is None else mask
    return model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, do_sample=False, pad_token_id=0,
                          **kwargs)


def mixed_workload(args, device) -> tuple[list, list[int]]:
    """``2 x batch`` prompts of lengths in ``[prompt/4, prompt]``, budgets in ``[new/4, new]`` (seeded)."""
    import torch

    g = torch.Generator().manual_seed(2)
    n = 2 * args.batch
    lengths = torch.randint(max(1, args.prompt // 4), args.prompt + 1, (n,), generator=g).tolist()
    news = torch.randint(max(1, args.new // 4), args.new + 1, (n,), generator=g).tolist()
    return [torch.randint(0, args.vocab, (m,), generator=g).to(device) for m in lengths], news


def _left_padded(prompts: list, width: int):
    """Prompts left-padded with 0 to ``width`` tokens, and their attention mask."""
    import torch

    ids = torch.zeros((len(prompts), width), dtype=torch.long, device=prompts[0].device)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - p.numel():] = p
        mask[i, width - p.numel():] = 1
    return ids, mask


def _calls(args, model, device):
    """The timed call, the new tokens it asks for, the first 8 new tokens of
    its first row (from the call's output) and hf_eager's for that row."""
    import torch

    cuda = device.type == "cuda"
    g = torch.Generator().manual_seed(1)
    if args.mixed:
        prompts, news = mixed_workload(args, device)
        check = min(CHECK_TOKENS, news[0])
        with torch.no_grad():
            expect = _hf_generate(model, prompts[0].view(1, -1), check, static=False)[:, -check:]
        asked = sum(news)
    else:
        ids = torch.randint(0, args.vocab, (args.batch, args.prompt), generator=g).to(device)
        with torch.no_grad():
            expect = _hf_generate(model, ids, CHECK_TOKENS, static=False)[:, args.prompt:]
        asked = args.batch * args.new
    if args.mode.startswith("opforge"):
        import opforge

        opforge.nn.patch(model)
        graph = args.mode != "opforge_nograph" and cuda
        if args.mixed:
            def call():
                return opforge.nn.generate(model, prompts, news, max_batch=args.batch, cuda_graph=graph)

            def first(out):
                return out[0][prompts[0].numel():][None, :check]
        else:
            def call():
                return opforge.nn.generate(model, ids, args.new, cuda_graph=graph, paged=args.mode == "opforge_paged",
                                           max_batch=args.batch)

            def first(out):
                return out[:, args.prompt:args.prompt + CHECK_TOKENS]
        return call, asked, first, expect
    static = args.mode == "hf_static_compile"
    if args.mixed:  # static batches of `batch` requests, one padded shape for all
        width, most = max(p.numel() for p in prompts), max(news)
        chunks = [_left_padded(prompts[i:i + args.batch], width) for i in range(0, len(prompts), args.batch)]

        def call():
            with torch.no_grad():
                return [_hf_generate(model, ids, most, static, mask) for ids, mask in chunks]

        def first(out):
            return out[0][:1, width:width + check]
    else:
        def call():
            with torch.no_grad():
                return _hf_generate(model, ids, args.new, static)

        def first(out):
            return out[:, args.prompt:args.prompt + CHECK_TOKENS]
    return call, asked, first, expect


def run_child(args) -> dict:
    import torch

    device = torch.device(args.device)
    cuda = device.type == "cuda"
    model = build_model(args, device).eval()
    model.config.use_cache = True
    model.generation_config.eos_token_id = None
    call, asked, first, expect = _calls(args, model, device)
    warmup = max(args.warmup, 2) if args.mode == PEER else args.warmup  # the peer: compiled and warm when timed
    times, warm_times, out = [], [], None
    for i in range(warmup + args.repeats):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = call()
        if cuda:
            torch.cuda.synchronize()
        (times if i >= warmup else warm_times).append(time.perf_counter() - t0)
    median = statistics.median(times)
    match = bool(torch.equal(first(out), expect))
    return {"mode": args.mode, "batch": args.batch, "prompt": args.prompt, "new": args.new, "mixed": args.mixed,
            "new_tokens": asked, "s_per_call": median, "s_all": times, "warmup_s": warm_times,
            "first_call_s": warm_times[0] if warm_times else None, "tokens_per_s": asked / median, "match": match,
            "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_arguments(p)
    p.add_argument("--batches", default="1,8,64")
    p.add_argument("--prompt", type=int, default=2048)
    p.add_argument("--new", type=int, default=128)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--mixed", action="store_true", help="2 x batch requests of mixed prompt lengths and budgets")
    p.add_argument("--device", default=None)
    p.add_argument("--out", choices=("json",), default=None)
    p.add_argument("--mode", help=argparse.SUPPRESS)  # a child: this one mode ...
    p.add_argument("--batch", type=int, help=argparse.SUPPRESS)  # ... at this one batch size
    args = p.parse_args()
    args.seq = args.prompt + args.new  # build_model sizes the position table from it
    if args.device is None:
        import torch
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.mode:
        print("RESULT " + json.dumps(run_child(args)))
        return
    forwarded = [a for a in sys.argv[1:] if not a.startswith("--out") and a != "json"]
    entries = []
    for batch in (int(b) for b in args.batches.split(",")):
        for mode in args.modes.split(","):
            if mode not in MODES:
                raise SystemExit(f"unknown mode {mode!r}; modes: {', '.join(MODES)}")
            if args.mixed and mode in STATIC_ONLY:
                print(f"batch {batch:3d} {mode:18s} skipped: the static cache needs one prompt length", flush=True)
                continue
            entry = _run_one(forwarded, args.device, mode, batch)
            entries.append(entry)
            print(_row(entry), flush=True)
    _with_ratios(entries)
    for e in entries:
        if "vs_peer" in e:
            print(f"  batch {e['batch']:3d} {e['mode']:18s} {e['vs_peer']:.3f}x {PEER}")
    config = {k: getattr(args, k) for k in ("layers", "hidden", "intermediate", "heads", "kv_heads", "vocab",
                                            "dtype", "prompt", "new", "warmup", "repeats", "untied", "mixed")}
    report = {"schema_version": SCHEMA_VERSION, "date": dt.date.today().isoformat(), **versions(),
              "config": config, "entries": entries}
    if args.out == "json":
        gpu = "h200" if "H200" in (report["gpu"] or "") else ("gpu" if report["gpu"] else "cpu")
        kind = "llm-generate-mixed" if args.mixed else "llm-generate"
        path = HERE / "results" / f"{gpu}-{report['date']}-{kind}.json"
        path.write_text(json.dumps(_merged(path, report), indent=1) + "\n")
        print(f"wrote {path}")


def _run_one(forwarded: list[str], device: str, mode: str, batch: int) -> dict:
    """One (mode, batch) in its own process; its RESULT line, or why it failed."""
    cmd = [sys.executable, __file__, *forwarded, "--device", device, "--mode", mode, "--batch", str(batch)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ), timeout=CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"mode": mode, "batch": batch, "error": [f"timed out after {CHILD_TIMEOUT_S} s"]}
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line:
        return json.loads(line[len("RESULT "):])
    return {"mode": mode, "batch": batch, "error": (proc.stderr or proc.stdout).strip().splitlines()[-5:]}


def _merged(path: Path, report: dict) -> dict:
    """Batch sizes and modes run in separate calls (a device call has a time limit) land
    in one file: an earlier file of the same config and versions keeps the (mode, batch)
    entries this run did not repeat, and the ratios are recomputed over all of them."""
    if not path.exists():
        return report
    old = json.loads(path.read_text())
    if not all(old.get(k) == report.get(k) for k in ("config", "gpu", "torch", "triton", "transformers")):
        return report
    mine = {(e["mode"], e["batch"]) for e in report["entries"]}
    entries = [e for e in old["entries"] if (e["mode"], e["batch"]) not in mine] + report["entries"]
    entries.sort(key=lambda e: (e["batch"], MODES.index(e["mode"])))
    _with_ratios(entries)
    return dict(report, entries=entries)


def _with_ratios(entries: list[dict]) -> None:
    """Each timed entry's tokens/s as a ratio to the peer's at the same batch size."""
    peers = {e["batch"]: e for e in entries if e["mode"] == PEER and "tokens_per_s" in e}
    for e in entries:
        if e["batch"] in peers and "tokens_per_s" in e:
            e["vs_peer"] = e["tokens_per_s"] / peers[e["batch"]]["tokens_per_s"]


def _row(e: dict) -> str:
    head = f"batch {e['batch']:3d} {e['mode']:18s}"
    if "tokens_per_s" not in e:
        return f"{head} FAILED: {e['error']}"
    peak = f"{e['peak_gib']:.1f} GiB peak" if e["peak_gib"] is not None else "peak n/a"
    first = e.get("first_call_s")
    compile_s = f"  first call {first:.1f} s (compile, capture)" if first is not None else ""
    return f"{head} {e['tokens_per_s']:9.1f} tokens/s  {e['s_per_call'] * 1e3:9.1f} ms/call  {peak}  " \
           f"match {e['match']}{compile_s}"


if __name__ == "__main__":
    main()

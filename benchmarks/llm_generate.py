"""Greedy generation of a Llama-style model, opforge against transformers (issue 30's third goal).

    python benchmarks/llm_generate.py                                  # batch 1, 8, 64; 2k prompt; 128 new tokens
    python benchmarks/llm_generate.py --batches 8 --modes hf_static_compile,opforge
    python benchmarks/llm_generate.py --out json     # also write benchmarks/results/<gpu>-<date>-llm-generate.json
                                                     # (calls of the same config merge into that file)

The model is the one ``llm_train_step.py`` builds (Llama-3.2-1B's shape by
default, random weights, bf16, eval mode). Each (mode, batch) runs in its own
process (compile caches and peak memory are its own). Modes:

* ``hf_static_compile``: transformers' ``generate`` with SDPA, a static cache
  (``cache_implementation="static"``) and its automatic ``torch.compile`` of
  the decode forward (``CompileConfig()``: mode ``reduce-overhead``, CUDA
  graphs): the issue's peer.
* ``hf_eager``: transformers' ``generate`` with SDPA and its dynamic cache.
* ``opforge``: ``opforge.nn.patch(model)``, then ``opforge.nn.generate``
  (static KV cache, ``attention_decode``, the decode step in a CUDA graph).
* ``opforge_nograph``: the same without the CUDA graph (the graph's share).

Every mode decodes greedily ``--new`` tokens after a ``--prompt``-token random
prompt, no end-of-sequence stop. tokens/s = batch x new tokens / the whole
call (prefill included), median of ``--repeats`` calls after ``--warmup``
calls (compiles, graph capture). ``match`` says whether the mode's tokens equal
``hf_eager``'s on the first 8 new tokens of each row (bf16 argmax ties can
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
MODES = ("hf_static_compile", "hf_eager", "opforge", "opforge_nograph")
PEER = "hf_static_compile"
CHECK_TOKENS = 8


def _hf_generate(model, ids, new, static: bool):
    import torch
    from transformers import CompileConfig

    kwargs = dict(cache_implementation="static", compile_config=CompileConfig()) if static else {}
    return model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                          do_sample=False, pad_token_id=0, **kwargs)


def run_child(args) -> dict:
    import torch

    device = torch.device(args.device)
    cuda = device.type == "cuda"
    model = build_model(args, device).eval()
    model.config.use_cache = True
    model.generation_config.eos_token_id = None
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, args.vocab, (args.batch, args.prompt), generator=g).to(device)
    with torch.no_grad():
        expect = _hf_generate(model, ids, CHECK_TOKENS, static=False)[:, args.prompt:]
    if args.mode.startswith("opforge"):
        import opforge

        opforge.nn.patch(model)
        graph = args.mode == "opforge" and cuda

        def call():
            return opforge.nn.generate(model, ids, args.new, cuda_graph=graph)
    else:
        static = args.mode == "hf_static_compile"

        def call():
            with torch.no_grad():
                return _hf_generate(model, ids, args.new, static)
    times, out = [], None
    for i in range(args.warmup + args.repeats):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = call()
        if cuda:
            torch.cuda.synchronize()
        if i >= args.warmup:
            times.append(time.perf_counter() - t0)
    median = statistics.median(times)
    match = bool(torch.equal(out[:, args.prompt:args.prompt + CHECK_TOKENS], expect))
    return {"mode": args.mode, "batch": args.batch, "prompt": args.prompt, "new": args.new, "s_per_call": median,
            "s_all": times, "tokens_per_s": args.batch * args.new / median, "match": match,
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
            proc = subprocess.run([sys.executable, __file__, *forwarded, "--device", args.device, "--mode", mode,
                                   "--batch", str(batch)], capture_output=True, text=True, env=dict(os.environ))
            line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
            entry = json.loads(line[len("RESULT "):]) if line else \
                {"mode": mode, "batch": batch, "error": (proc.stderr or proc.stdout).strip().splitlines()[-5:]}
            entries.append(entry)
            print(_row(entry), flush=True)
    _with_ratios(entries)
    for e in entries:
        if "vs_peer" in e:
            print(f"  batch {e['batch']:3d} {e['mode']:18s} {e['vs_peer']:.3f}x {PEER}")
    config = {k: getattr(args, k) for k in ("layers", "hidden", "intermediate", "heads", "kv_heads", "vocab",
                                            "dtype", "prompt", "new", "warmup", "repeats", "untied")}
    report = {"schema_version": SCHEMA_VERSION, "date": dt.date.today().isoformat(), **versions(),
              "config": config, "entries": entries}
    if args.out == "json":
        gpu = "h200" if "H200" in (report["gpu"] or "") else ("gpu" if report["gpu"] else "cpu")
        path = HERE / "results" / f"{gpu}-{report['date']}-llm-generate.json"
        path.write_text(json.dumps(_merged(path, report), indent=1) + "\n")
        print(f"wrote {path}")


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
    return f"{head} {e['tokens_per_s']:9.1f} tokens/s  {e['s_per_call'] * 1e3:9.1f} ms/call  {peak}  " \
           f"match {e['match']}"


if __name__ == "__main__":
    main()

"""Greedy generation of a Llama-style model, opforge against transformers (issue 30's third goal).

    python benchmarks/llm_generate.py                                  # batch 1, 8, 64; 2k prompt; 128 new tokens
    python benchmarks/llm_generate.py --batches 8 --modes hf_static_compile,opforge,opforge_paged
    python benchmarks/llm_generate.py --jsonl rows.jsonl   # append each row as it finishes (a timeout keeps them)
    python benchmarks/llm_generate.py --mixed        # requests of mixed lengths (see below)
    python benchmarks/llm_generate.py --out json     # also write benchmarks/results/<gpu>-<date>-llm-generate.json
                                                     # (calls of the same config merge into that file)

The model is the one ``llm_train_step.py`` builds (Llama-3.2-1B's shape by
default, random weights, bf16, eval mode, KV cache on for ``generate``).
Each (mode, batch) runs in its own process (compile caches and peak memory
are its own; ``--child-timeout`` seconds at most). Modes:

* ``hf_static_compile``: the issue's peer, transformers' ``generate`` with
  SDPA, a ``StaticCache`` of ``prompt + new`` tokens that the caller makes
  once and passes to every call (``cache=``, reset in place before each), and
  transformers' automatic ``torch.compile`` of the decode forward
  (``CompileConfig(fullgraph=True)``: inductor, ``reduce-overhead`` = CUDA
  graphs; the prefill stays eager, as transformers does it). Owning the
  cache keeps its addresses, which the CUDA graphs hold, the same across
  calls. At least two warm-up calls of the same shapes come before the timed
  ones; a child whose warm-up compiled nothing fails.
* ``hf_static_compile_new_cache`` (on request: a diagnosis): the same with
  ``cache_implementation="static"``, transformers' own new cache each call.
* ``hf_eager``: transformers' ``generate`` with SDPA and its dynamic cache.
* ``opforge``: ``opforge.nn.patch(model)``, then ``opforge.nn.generate``
  (static KV cache, ``attention_decode``, the decode step in a CUDA graph,
  captured once a call).
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
largest budget: one compiled shape, one cache), and only the tokens asked
for count. The static ``opforge`` modes need one prompt length and are skipped.

tokens/s = the new tokens asked for / the whole call (prefill included),
median of ``--repeats`` calls after ``--warmup`` calls (compiles, graph
capture). Each timed call also reports the graphs dynamo compiled in it and
the CUDA graphs captured in it (a warm compiled peer: 0 and 0), with the
warm-up's compiles and inductor's CUDA-graph skips.

The token check, against ``hf_eager`` (recomputed in each child with one
short eager generate): ``match`` = the mode's first 8 new tokens of each row
(mixed: of the first request) equal the reference's. With random weights the
top logits are close, so bf16 rounding alone can turn a greedy choice; what
tells rounding from a bug: ``lead_equal`` (leading equal tokens per row),
``divergence_gap`` (at each row's first difference, where both had the same
prefix, the reference's own logit margin of its token over the mode's),
``first_logits_err`` (max |first-step logits - the fp32 model's| over
``LOGIT_ROWS`` rows; opforge's from its patched forward) beside
``hf_bf16_logits_err`` (the same for transformers' bf16 forward), and
``bf16_consistent`` = the gap is within the two errors and opforge's error is
at most twice transformers'. Prints each (mode, batch) as it finishes and the
ratios to ``hf_static_compile``.
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
MODES = ("hf_static_compile", "hf_eager", "opforge", "opforge_nograph", "opforge_paged",
         "hf_static_compile_new_cache")
DEFAULT_MODES = MODES[:5]  # hf_static_compile_new_cache on request (--modes): a diagnosis, not the peer
STATIC_ONLY = ("opforge", "opforge_nograph")  # one prompt length: not for --mixed
CHILD_TIMEOUT_S = 240
PEER = "hf_static_compile"
CHECK_TOKENS = 8
LOGIT_ROWS = 4  # rows whose first-step logits are compared with the fp32 model's
RECOMPILE_LINES = 6  # of a child's recompile reasons, kept in its entry


def _compile_config(device):
    """transformers' automatic compile of the decode forward (``CompileConfig``: inductor, ``reduce-overhead`` =
    CUDA graphs), ``fullgraph`` so a graph break fails loudly instead of splitting the step. transformers
    compiles on CUDA only; a CPU smoke run compiles too (``_compile_all_devices``) so its recompiles show."""
    from transformers import CompileConfig

    config = CompileConfig(fullgraph=True)
    config._compile_all_devices = device.type != "cuda"
    return config


def _hf_generate(model, ids, new, mask=None, cache=None, compile_config=None, **extra):
    """transformers' greedy ``generate``: with ``cache`` (a ``StaticCache``, reset here) and ``compile_config``
    the compiled static-cache decode; ``cache="static"``: ``cache_implementation="static"`` (a new cache a
    call); neither: the dynamic cache, eager."""
    import torch

    kwargs = dict(extra)
    if cache == "static":
        kwargs.update(cache_implementation="static", compile_config=compile_config)
    elif cache is not None:
        cache.reset()  # in place: the cache's addresses, which the CUDA graphs hold, stay the same
        kwargs.update(cache=cache, compile_config=compile_config)
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


def _workload(args, device):
    """The call's prompts: ``ids`` ``[batch, prompt]``, or (``--mixed``) the mixed
    prompts and budgets; the rows the token check compares (their prompts) and how
    many new tokens it compares."""
    import torch

    if args.mixed:
        prompts, news = mixed_workload(args, device)
        return (prompts, news), prompts[0].view(1, -1), min(CHECK_TOKENS, news[0])
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, args.vocab, (args.batch, args.prompt), generator=g).to(device)
    return ids, ids, CHECK_TOKENS


def _calls(args, model, device, work, check: int):
    """The timed call, the new tokens it asks for, and the first ``check`` new
    tokens of the checked rows in the call's output."""
    import torch

    cuda = device.type == "cuda"
    if args.mixed:
        prompts, news = work
        asked = sum(news)
    else:
        ids = work
        asked = args.batch * args.new
    if args.mode.startswith("opforge"):
        import opforge

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
                return out[:, args.prompt:args.prompt + check]
        return call, asked, first
    compile_config = _compile_config(device)
    if args.mixed:  # static batches of `batch` requests, one padded shape for all
        width, most = max(p.numel() for p in prompts), max(news)
        chunks = [_left_padded(prompts[i:i + args.batch], width) for i in range(0, len(prompts), args.batch)]
        cache = _peer_cache(args.mode, model, width + most)

        def call():
            with torch.no_grad():
                return [_hf_generate(model, c_ids, most, c_mask, cache, compile_config) for c_ids, c_mask in chunks]

        def first(out):
            return out[0][:1, width:width + check]
    else:
        cache = _peer_cache(args.mode, model, args.prompt + args.new)

        def call():
            with torch.no_grad():
                return _hf_generate(model, ids, args.new, None, cache, compile_config)

        def first(out):
            return out[:, args.prompt:args.prompt + check]
    return call, asked, first


def _peer_cache(mode: str, model, length: int):
    """The HF modes' cache argument: the peer's own ``StaticCache`` (made once,
    reset in place before each call), "static" for a new one each call, or
    None (hf_eager: the dynamic cache)."""
    from transformers import StaticCache

    if mode == PEER:
        return StaticCache(config=model.config, max_cache_len=length)
    return "static" if mode == "hf_static_compile_new_cache" else None


class CompileCounts:
    """Graphs dynamo compiled (a first compile, a recompile, each piece of a
    graph break) and CUDA graph captures so far: a warm call should add none
    (transformers' CUDA graphs are re-recorded, not recompiled, when a static
    input moves; opforge's static mode captures one graph a call by design)."""

    def __init__(self, cuda: bool):
        import torch

        self.captures = 0 if cuda else None
        if cuda:
            counts = self

            class CountedGraph(torch.cuda.CUDAGraph):
                def capture_begin(self, *args, **kwargs):
                    counts.captures += 1
                    return super().capture_begin(*args, **kwargs)

            torch.cuda.CUDAGraph = CountedGraph  # cudagraph trees and opforge make theirs through this name

    def read(self) -> tuple[int, int | None]:
        from torch._dynamo.utils import counters

        return counters["stats"]["unique_graphs"], self.captures

    @staticmethod
    def cudagraph_skips() -> int:
        """Compiled graphs inductor ran without CUDA graphs (``reduce-overhead`` asked for them)."""
        from torch._dynamo.utils import counters

        return counters["inductor"]["cudagraph_skips"]


def first_divergence(tokens, expect, ref_logits) -> tuple[list[int], float]:
    """Per checked row, how many leading new tokens equal the reference's; and
    over the rows that differ, the largest gap, in the reference's own logits at
    the first differing step (where both had the same prefix), between the
    reference's token and this mode's: near 0 means the reference itself was
    at a near-tie there, so bf16 rounding can turn it."""
    leads, gap = [], 0.0
    for r in range(tokens.shape[0]):
        differ = (tokens[r] != expect[r]).nonzero()
        if differ.numel() == 0:
            leads.append(int(tokens.shape[1]))
            continue
        s = int(differ[0])
        leads.append(s)
        gap = max(gap, float(ref_logits[r, s, expect[r, s]] - ref_logits[r, s, tokens[r, s]]))
    return leads, gap


def _first_logits(model, ids):
    """The first generated token's logits (fp32) of the model's own forward over the prompts."""
    import torch

    with torch.no_grad():
        return model(input_ids=ids, logits_to_keep=1).logits[:, -1].float()


def _reference(model, ref_ids, check: int):
    """hf_eager's first ``check`` new tokens of the checked rows, its logits at each of those steps,
    the fp32 model's first-step logits of up to ``LOGIT_ROWS`` rows, and bf16 HF's error against them."""
    import copy

    import torch

    with torch.no_grad():
        ref = _hf_generate(model, ref_ids, check, output_logits=True, return_dict_in_generate=True)
    expect, ref_logits = ref.sequences[:, -check:], torch.stack(ref.logits, 1)
    rows = ref_ids[:LOGIT_ROWS]
    exact = _first_logits(copy.deepcopy(model).float(), rows)
    hf_err = float((ref_logits[:LOGIT_ROWS, 0] - exact).abs().max())
    return expect, ref_logits, exact, hf_err


def generation_model(args, device):
    """``llm_train_step``'s model in eval mode, set up for ``generate``: KV cache on, no eos stop.

    Its config says ``use_cache=False`` (training) and ``generate`` reads the
    ``generation_config`` made from it at construction: setting only
    ``config.use_cache`` left every HF step re-running the whole sequence with
    no KV cache and no static cache, so nothing was compiled (the peer and
    ``hf_eager`` of the 2026-12-02 runs)."""
    model = build_model(args, device).eval()
    model.config.use_cache = model.generation_config.use_cache = True
    model.generation_config.eos_token_id = None
    return model


def run_child(args) -> dict:
    import torch

    torch._logging.set_logs(recompiles=True)  # the reasons go to stderr; the parent keeps the first lines
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    model = generation_model(args, device)
    work, ref_ids, check = _workload(args, device)
    expect, ref_logits, exact, hf_err = _reference(model, ref_ids, check)
    mode_err = hf_err  # the HF modes' first step is transformers' own bf16 forward
    if args.mode.startswith("opforge"):
        import opforge

        opforge.nn.patch(model)
        mode_err = float((_first_logits(model, ref_ids[:LOGIT_ROWS]) - exact).abs().max())
    counts = CompileCounts(cuda)
    call, asked, first = _calls(args, model, device, work, check)
    if cuda:
        torch.cuda.reset_peak_memory_stats()  # the mode's peak, not the reference's fp32 copy
    warmup = max(args.warmup, 2) if args.mode.startswith("hf_static") else args.warmup  # compiled and warm
    times, warm_times, compiles, captures, out = [], [], [], [], None
    start, warm_compiles = counts.read()[0], None
    for i in range(warmup + args.repeats):
        before = counts.read()
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = call()
        if cuda:
            torch.cuda.synchronize()
        elapsed, after = time.perf_counter() - t0, counts.read()
        if i < warmup:
            warm_times.append(elapsed)
            continue
        if warm_compiles is None:
            warm_compiles = before[0] - start
        times.append(elapsed)
        compiles.append(after[0] - before[0])
        captures.append(None if after[1] is None else after[1] - before[1])
    if args.mode.startswith("hf_static") and not warm_compiles:
        raise SystemExit(f"{args.mode}: nothing was compiled in the warm-up calls (no static cache, or no compile)")
    median = statistics.median(times)
    tokens = first(out)
    leads, gap = first_divergence(tokens, expect, ref_logits)
    return {"mode": args.mode, "batch": args.batch, "prompt": args.prompt, "new": args.new, "mixed": args.mixed,
            "new_tokens": asked, "s_per_call": median, "s_all": times, "warmup_s": warm_times,
            "first_call_s": warm_times[0] if warm_times else None, "tokens_per_s": asked / median,
            "warmup_compiles": warm_compiles, "compiles_per_call": compiles,
            "cudagraph_skips": counts.cudagraph_skips(), "graph_captures_per_call": captures,
            "match": bool(torch.equal(tokens, expect)), "checked_tokens": check, "lead_equal": leads,
            "divergence_gap": gap,
            "first_logits_err": mode_err, "hf_bf16_logits_err": hf_err,
            "bf16_consistent": gap <= hf_err + mode_err and mode_err <= 2 * hf_err,
            "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_arguments(p)
    p.add_argument("--batches", default="1,8,64")
    p.add_argument("--prompt", type=int, default=2048)
    p.add_argument("--new", type=int, default=128)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--modes", default=",".join(DEFAULT_MODES), help=f"of {', '.join(MODES)}")
    p.add_argument("--mixed", action="store_true", help="2 x batch requests of mixed prompt lengths and budgets")
    p.add_argument("--device", default=None)
    p.add_argument("--out", choices=("json",), default=None)
    p.add_argument("--jsonl", type=Path, default=None,
                   help="append each (mode, batch) entry to this file as it finishes (a timeout keeps the rows)")
    p.add_argument("--child-timeout", type=int, default=CHILD_TIMEOUT_S, help="seconds for one (mode, batch)")
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
    modes = args.modes.split(",")
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise SystemExit(f"unknown mode(s) {', '.join(unknown)}; modes: {', '.join(MODES)}")
    config = {k: getattr(args, k) for k in ("layers", "hidden", "intermediate", "heads", "kv_heads", "vocab",
                                            "dtype", "prompt", "new", "warmup", "repeats", "untied", "mixed")}
    entries = []
    for batch in (int(b) for b in args.batches.split(",")):
        for mode in modes:
            if args.mixed and mode in STATIC_ONLY:
                print(f"batch {batch:3d} {mode:18s} skipped: the static cache needs one prompt length", flush=True)
                continue
            entry = _run_one(forwarded, args.device, mode, batch, args.child_timeout)
            entries.append(entry)
            print(_row(entry), flush=True)
            if args.jsonl is not None:
                with args.jsonl.open("a") as f:
                    f.write(json.dumps({"config": config, **entry}) + "\n")
    _with_ratios(entries)
    for e in entries:
        if "vs_peer" in e:
            print(f"  batch {e['batch']:3d} {e['mode']:18s} {e['vs_peer']:.3f}x {PEER}")
    report = {"schema_version": SCHEMA_VERSION, "date": dt.date.today().isoformat(), **versions(),
              "config": config, "entries": entries}
    if args.out == "json":
        gpu = "h200" if "H200" in (report["gpu"] or "") else ("gpu" if report["gpu"] else "cpu")
        kind = "llm-generate-mixed" if args.mixed else "llm-generate"
        path = HERE / "results" / f"{gpu}-{report['date']}-{kind}.json"
        path.write_text(json.dumps(_merged(path, report), indent=1) + "\n")
        print(f"wrote {path}")


def _run_one(forwarded: list[str], device: str, mode: str, batch: int, timeout_s: int) -> dict:
    """One (mode, batch) in its own process; its RESULT line (with the first
    recompile reasons it logged), or why it failed."""
    cmd = [sys.executable, __file__, *forwarded, "--device", device, "--mode", mode, "--batch", str(batch)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ), timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"mode": mode, "batch": batch, "error": [f"timed out after {timeout_s} s"]}
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line:
        reasons = [ln.strip() for ln in proc.stderr.splitlines() if "__recompiles" in ln]
        return dict(json.loads(line[len("RESULT "):]), recompile_log=reasons[:RECOMPILE_LINES])
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
    captures = e["graph_captures_per_call"]
    warm = f"compiles {e['compiles_per_call']} graph captures {captures if captures[0] is not None else 'n/a'} " \
           f"(warm-up compiles {e['warmup_compiles']}, cudagraph skips {e['cudagraph_skips']})"
    leads = e["lead_equal"]
    check = f"tokens equal {e['match']} (leading equal >= {min(leads)}/{e['checked_tokens']} in {len(leads)} rows), " \
            f"gap {e['divergence_gap']:.3f}, logits err {e['first_logits_err']:.3f} (HF bf16 " \
            f"{e['hf_bf16_logits_err']:.3f}), bf16-consistent {e['bf16_consistent']}"
    return f"{head} {e['tokens_per_s']:9.1f} tokens/s  {e['s_per_call'] * 1e3:9.1f} ms/call  {peak}{compile_s}\n" \
           f"    timed calls: {warm}; {check}"


if __name__ == "__main__":
    main()

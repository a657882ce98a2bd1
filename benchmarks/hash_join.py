"""Hash join throughput: build ⋈ probe on int32 keys with int32 payloads (issue 8: 10M ⋈ 100M,
goal >= 20 G build+probe tuples/s; torch sort + searchsorted does about 7.1 G on the H200).

    python benchmarks/hash_join.py [--build 10000000] [--probe 100000000] [--device cuda]
                                   [--distinct N] [--repeats 10] [--out PATH]

Each entry times one whole join: the (build row, probe row) pairs and the gather of both int32
payloads for them (what an inner join hands to the next operator), after one warm-up run.
Contenders: ``opforge.hash_join`` with each of its variants forced through dispatch
(``triton_hash`` is the Triton open-addressing table; ``torch_sort`` / ``reference`` are the
sort-based ones), the SQL engine's physical join (``opforge.sql.physical.join.join_pairs``:
hash and sort-merge), and the peer, plain torch sort + searchsorted. Every contender's pairs are
checked equal to the peer's (all come out ordered by probe row, then build row).

Keys: ``--distinct`` unset: unique build keys (a permutation of the even numbers below 2 * build)
and probe keys uniform below 2 * build, so about half the probes hit one row. Else build keys
uniform in ``[0, distinct)`` (duplicates) and probe keys in ``[0, 2 * distinct)``.
Throughput = (build + probe) / median time. GPU times: ``triton.testing.do_bench`` with the L2
flushed between runs (``opforge.runtime.timing``); CPU: wall clock. JSON to ``--out`` (default
``benchmarks/results/hash-join-<device>-<date>.json``).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

import torch  # noqa: E402

SCHEMA_VERSION = 1


def make_inputs(n_build: int, n_probe: int, distinct: int | None, device) -> dict:
    g = torch.Generator(device="cpu").manual_seed(8)
    if distinct is None:
        bk = torch.randperm(n_build, generator=g, dtype=torch.int32) * 2
        space = 2 * n_build
    else:
        bk = torch.randint(0, distinct, (n_build,), generator=g, dtype=torch.int32)
        space = 2 * distinct
    pk = torch.randint(0, space, (n_probe,), generator=g, dtype=torch.int32)
    bp = torch.randint(-2**31, 2**31 - 1, (n_build,), generator=g, dtype=torch.int32)
    pp = torch.randint(-2**31, 2**31 - 1, (n_probe,), generator=g, dtype=torch.int32)
    return {k: v.to(device) for k, v in dict(bk=bk, pk=pk, bp=bp, pp=pp).items()}


def sort_searchsorted(bk: torch.Tensor, pk: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The peer: stable sort of the build keys, a searchsorted range per probe key."""
    sk, order = torch.sort(bk, stable=True)
    lo = torch.searchsorted(sk, pk, side="left")
    cnt = torch.searchsorted(sk, pk, side="right") - lo
    total = int(cnt.sum())
    pi = torch.repeat_interleave(torch.arange(len(pk), device=pk.device), cnt, output_size=total)
    within = torch.arange(total, device=pk.device) - (torch.cumsum(cnt, 0) - cnt)[pi]
    return order[lo[pi] + within], pi


def contenders(device: torch.device) -> dict:
    """name -> (variant label, fn(bk, pk) -> (build_index, probe_index))."""
    from opforge.ops import hashing as H
    from opforge.runtime import dispatch, registry
    from opforge.sql.physical.join import join_pairs

    out = {}
    op = registry.get("hash_join")
    for v in op.variants:
        reason = dispatch.reject_reason(op, v, (torch.empty(1, dtype=torch.int32, device=device),) * 2
                                        + ("inner", None, None))
        if reason is not None:
            continue

        def run(bk, pk, _v=v.name):
            with dispatch.force_variant("hash_join", _v):
                return H.hash_join(bk, pk, how="inner")
        out[f"opforge.hash_join[{v.name}]"] = (v.name, run)

    def sql_hash(bk, pk):
        pi, bi = join_pairs(pk, bk, algorithm="hash")
        return bi, pi

    def sql_merge(bk, pk):
        pi, bi = join_pairs(pk, bk, algorithm="merge")
        return bi, pi

    out["sql join_pairs[hash]"] = (_variant_of(device), sql_hash)
    out["sql join_pairs[sort-merge]"] = ("torch sort + searchsorted", sql_merge)
    out["torch sort+searchsorted (peer)"] = ("torch", sort_searchsorted)
    return out


def _variant_of(device) -> str:
    import opforge

    x = torch.empty(1, dtype=torch.int32, device=device)
    return opforge.explain("hash_join", x, x, "inner", None, None).variant.name


def bench(fn, device: torch.device, repeats: int) -> float:
    from opforge.runtime import timing

    if device.type == "cuda":
        return timing.bench_gpu(fn, warmup_ms=25, rep_ms=max(100, 20 * repeats))
    return timing.bench_cpu(fn, repeats=repeats)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", type=int, default=10_000_000)
    parser.add_argument("--probe", type=int, default=100_000_000)
    parser.add_argument("--distinct", type=int, default=None, help="build keys drawn from [0, distinct)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--only", default=None, help="comma list of substrings of contender names")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    device = torch.device(args.device)

    from opforge.runtime.device import versions

    x = make_inputs(args.build, args.probe, args.distinct, device)
    bk, pk, bp, pp = x["bk"], x["pk"], x["bp"], x["pp"]
    ref_b, ref_p = sort_searchsorted(bk, pk)
    pairs = int(ref_b.numel())
    tuples = args.build + args.probe
    entries = []
    peer_ms = None
    items = list(contenders(device).items())
    items.sort(key=lambda kv: "(peer)" not in kv[0])  # the peer first: ratios need its time
    for name, (variant, fn) in items:
        if args.only and "(peer)" not in name and not any(s in name for s in args.only.split(",")):
            continue

        def join_with_payloads(fn=fn):
            bi, pi = fn(bk, pk)
            return bp[bi], pp[pi]

        bi, pi = fn(bk, pk)
        ok = bool(torch.equal(bi, ref_b) and torch.equal(pi, ref_p))
        del bi, pi
        ms = bench(join_with_payloads, device, args.repeats)
        if "(peer)" in name:
            peer_ms = ms
        entry = {
            "name": name, "variant": variant, "median_ms": ms,
            "gtuples_per_s": tuples / (ms * 1e-3) / 1e9,
            "speedup_vs_sort_searchsorted": (peer_ms / ms) if peer_ms else None,
            "pairs_equal_peer": ok,
        }
        entries.append(entry)
        print(f"{name:40s} {variant:28s} {ms:9.3f} ms  {entry['gtuples_per_s']:7.2f} G tuples/s  "
              f"x{entry['speedup_vs_sort_searchsorted'] or 1:.2f}  {'ok' if ok else 'WRONG'}", flush=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()

    info = versions()
    doc = {
        "schema_version": SCHEMA_VERSION,
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "benchmark": "hash_join",
        "device": str(device),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else "",
        "driver": info.get("driver", ""), "torch": info.get("torch", ""), "triton": info.get("triton", ""),
        "build_rows": args.build, "probe_rows": args.probe, "distinct": args.distinct,
        "key_dtype": "int32", "payload_dtype": "int32", "pairs": pairs,
        "goal_gtuples_per_s": 20.0,
        "entries": entries,
    }
    day = dt.date.today().isoformat()
    out = Path(args.out) if args.out else HERE / "results" / f"hash-join-{device.type}-{day}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {out}")
    return doc


if __name__ == "__main__":
    main()

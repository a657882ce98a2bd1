"""Issue 27 on the device: long rows, small odd rows, the scan and compaction.

For each case: a correctness check against torch (max abs error relative to the
largest reference value; exact for compaction), then the median time
(``triton.testing.do_bench``), GB/s of the fewest bytes the op moves, % of copy
(a clone of the same number of bytes, read + write, timed in the same run) and
the ratio to torch eager (> 1: faster than eager). Rows:

* ``dispatch``: what ``opforge.<op>`` runs today (the gate ``OPFORGE_ROWS`` is
  closed, so the new variants are not picked): the old path.
* ``wave ...``: the one-grid split (``kernels.waves``) with the config shown
  (statistics packed in 64-bit words; ``counter+fence``: the wave counter with
  a release fence instead).
* ``row ...``: the row-resident softmax with several rows a program.
* ``lookback LATE=0/1 ...`` / ``compact LATE=0/1 ...``: the look-back scan and
  the compaction kernel (kernel only: the output preallocated): ``LATE=0``
  today's kernels; ``LATE=1`` the loads first, the tile's scan after its
  look-back and (unless ``PACK=0``) status and value packed in one word;
  ``ORDERED=1``: no tile counter, the program id is the tile.

Every case catches its own failure and prints it; a time budget (140 s) skips
what is left of its section's share. Usage, from the repo root::

    PYTHONPATH=src python3 benchmarks/rows_scan.py [--only softmax,norm,small,scan,compact] [--quick]
        [--tuned OUT.jsonl]

``--tuned`` writes (else the log shows, as ``TUNED {...}`` lines), for each
op, variant and bucket measured, the fastest passing config as a tuned entry
(old variants, torch eager and the new ones alike, timed in the same run):
shipped as ``runtime/tuned/h200-rows.jsonl``, they let dispatch choose
between them by measurement once the gate is open.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback

os.environ.pop("OPFORGE_ROWS", None)  # the old path is dispatch's choice without the new variants

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from triton.testing import do_bench  # noqa: E402

import opforge  # noqa: E402
from opforge.kernels import norm as NK  # noqa: E402
from opforge.kernels import scan as SK  # noqa: E402
from opforge.kernels import softmax as K  # noqa: E402
from opforge.kernels.waves import wave_rows_for  # noqa: E402
from opforge.runtime import autotune, dispatch, registry  # noqa: E402
from opforge.runtime.cache import TuneEntry  # noqa: E402

BUDGET_S = 140.0
T0 = time.time()
BF, F32 = torch.bfloat16, torch.float32
_copy_cache: dict[int, float] = {}
_deadline = T0 + BUDGET_S  # the current section's: each gets an equal share of what is left


def ms_of(fn) -> float:
    return do_bench(fn, warmup=10, rep=40)


def copy_ms(nbytes: int) -> float:
    """A clone of ``nbytes / 2`` bytes: reads and writes ``nbytes`` in all."""
    if nbytes not in _copy_cache:
        src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
        _copy_cache[nbytes] = ms_of(lambda: src.clone())
        del src
    return _copy_cache[nbytes]


def rel_err(y, ref) -> float:
    y, ref = y.double(), ref.double()
    fin = torch.isfinite(ref)
    if not bool(torch.equal(torch.isfinite(y), fin)):
        return float("inf")
    scale = ref[fin].abs().max().item() if fin.any() else 1.0
    return ((y[fin] - ref[fin]).abs().max().item() / max(scale, 1e-30)) if fin.any() else 0.0


def line(section, variant, shape, ms, nbytes, eager_ms, err, tol, note=""):
    copy = copy_ms(nbytes)
    verdict = "PASS" if err <= tol else "FAIL"
    print(f"{section:<10} {variant:<34} {shape:<14} {ms * 1e3:9.1f} {nbytes / ms / 1e6:8.0f} "
          f"{100 * copy / ms:6.1f} {eager_ms / ms:6.2f} {err:9.2e} {verdict} {note}", flush=True)


_entries: dict[tuple, TuneEntry] = {}  # (op, variant, bucket) -> the fastest passing config


def record(entry, ms) -> None:
    """Keep ``entry = (op name, variant, args, config)`` timed at ``ms`` as a tuned entry."""
    if entry is None:
        return
    name, variant, args, cfg = entry
    op = registry.get(name)
    key = autotune.tune_key(op, op.variant(variant), args)
    slot = (key.op, key.variant, key.dtype, key.shape_bucket)
    if slot not in _entries or ms < _entries[slot].median_ms:
        _entries[slot] = TuneEntry(key, dict(cfg), ms)


def case(section, variant, shape, run, ref, nbytes, eager_ms, tol, entry=None):
    """Check ``run()`` against ``ref``, then time it; never raise. A passing
    case with ``entry`` is a candidate tuned entry (``--tuned``)."""
    if time.time() > _deadline:
        print(f"{section:<10} {variant:<34} {shape:<14} SKIPPED (time budget)", flush=True)
        return None
    try:
        out = run()
        torch.cuda.synchronize()
        err = rel_err(out, ref) if ref is not None else 0.0
        ms = ms_of(run)
        line(section, variant, shape, ms, nbytes, eager_ms, err, tol)
        if err <= tol:
            record(entry, ms)
        return ms
    except Exception as e:  # noqa: BLE001 - one failure must not stop the run
        msg = traceback.format_exception_only(type(e), e)[-1].strip()
        print(f"{section:<10} {variant:<34} {shape:<14} FAIL {msg[:160]}", flush=True)
        return None


def baselines(section, name, args, eager_fn, ours, shape, ref, nbytes, tol) -> float:
    """Time torch eager and today's dispatch (the old path) on registry ``args``; eager's ms."""
    eager = ms_of(eager_fn)
    case(section, "torch eager", shape, eager_fn, ref, nbytes, eager, tol, (name, "torch_eager", args, {}))
    d = dispatch.explain(name, *args)
    print(f"# dispatch: {d.variant.name} {d.config} ({d.source})")
    case(section, f"dispatch ({d.variant.name})", shape, ours, ref, nbytes, eager, tol,
         (name, d.variant.name, args, d.config))
    return eager


def header(title):
    print(f"\n== {title}")
    print(f"{'section':<10} {'variant':<34} {'shape':<14} {'us':>9} {'GB/s':>8} {'%copy':>6} {'xeager':>6} "
          f"{'rel_err':>9} check")


# ---------------------------------------------------------------------------
def long_softmax(quick):
    header("softmax, long rows (bf16): dispatch (old) vs wave")
    shapes = [(1024, 65536), (1024, 262144)] + ([] if quick else [(8, 1 << 20)])
    for rows, cols in shapes:
        x = torch.randn(rows, cols, device="cuda", dtype=BF) * 3
        ref = torch.softmax(x.float(), -1)
        shape, nbytes = f"{rows}x{cols}", 2 * x.numel() * 2
        eager = baselines("softmax", "softmax", (x, -1), lambda: torch.softmax(x, -1), lambda: opforge.softmax(x, -1),
                          shape, ref, nbytes, 1e-2)
        for i, (chunk, warps) in enumerate(((8192, 8), (4096, 4), (8192, 4))):
            for mib in (4,) if quick or i else (2, 4, 6, 8):
                cfg = {"CHUNK": chunk, "num_warps": warps, "WAVE_ROWS": wave_rows_for(cols * 2, mib << 20)}

                def run(cfg=cfg):
                    y = torch.empty_like(x)
                    K.launch_wave_forward(x, y, False, cfg)
                    return y
                case("softmax", f"wave {chunk}/{warps}w {mib}MiB", shape, run, ref, nbytes, eager, 1e-2,
                     ("softmax", "triton_wave", (x, -1), cfg))
        cfg = {"CHUNK": 8192, "num_warps": 8, "WAVE_ROWS": wave_rows_for(cols * 2, 8 << 20), "PACKED": 0}

        def unpacked(cfg=cfg):
            y = torch.empty_like(x)
            K.launch_wave_forward(x, y, False, cfg)
            return y
        case("softmax", "wave 8192/8w 8MiB counter+fence", shape, unpacked, ref, nbytes, eager, 1e-2)
        torch.cuda.empty_cache()


def long_norms(quick):
    header("layer_norm / rms_norm, long rows (bf16): dispatch (old) vs wave")
    shapes = [(1024, 65536), (1024, 262144)] + ([] if quick else [(8, 1 << 20)])
    for rows, cols in shapes:
        x = torch.randn(rows, cols, device="cuda", dtype=BF) + 1
        w = torch.rand(cols, device="cuda", dtype=BF) + 0.5
        b = torch.randn(cols, device="cuda", dtype=BF)
        shape, nbytes = f"{rows}x{cols}", 2 * x.numel() * 2
        for name in ("layer_norm", "rms_norm"):
            rms = name == "rms_norm"
            if rms:
                ref = F.rms_norm(x.float(), (cols,), w.float(), 1e-6)
                eager_fn = lambda: F.rms_norm(x, (cols,), w, 1e-6)  # noqa: E731
                ours = lambda: opforge.rms_norm(x, (cols,), w, 1e-6)  # noqa: E731
                args = (x, (cols,), 1e-6, w)
            else:
                ref = F.layer_norm(x.float(), (cols,), w.float(), b.float(), 1e-5)
                eager_fn = lambda: F.layer_norm(x, (cols,), w, b, 1e-5)  # noqa: E731
                ours = lambda: opforge.layer_norm(x, (cols,), w, b, 1e-5)  # noqa: E731
                args = (x, (cols,), 1e-5, w, b)
            eager = baselines(name, name, args, eager_fn, ours, shape, ref, nbytes, 2e-2)
            for i, (chunk, warps) in enumerate(((8192, 8), (4096, 4), (8192, 4))):
                for mib in (4,) if quick or i else (2, 4, 6, 8):
                    cfg = {"CHUNK": chunk, "num_warps": warps, "WAVE_ROWS": wave_rows_for(cols * 2, mib << 20)}

                    def run(cfg=cfg, rms=rms):
                        y = torch.empty_like(x)
                        NK.launch_fwd_wave(x, y, w, None if rms else b, None, None, 1e-6 if rms else 1e-5, rms, cfg)
                        return y
                    case(name, f"wave {chunk}/{warps}w {mib}MiB", shape, run, ref, nbytes, eager, 2e-2,
                         (name, "triton_wave", args, cfg))
            cfg = {"CHUNK": 8192, "num_warps": 8, "WAVE_ROWS": wave_rows_for(cols * 2, 8 << 20), "PACKED": 0}

            def unpacked(cfg=cfg, rms=rms):
                y = torch.empty_like(x)
                NK.launch_fwd_wave(x, y, w, None if rms else b, None, None, 1e-6 if rms else 1e-5, rms, cfg)
                return y
            case(name, "wave 8192/8w 8MiB counter+fence", shape, unpacked, ref, nbytes, eager, 2e-2)
        torch.cuda.empty_cache()


def small_rows(quick):
    header("softmax fp32 4097x3001: rows per program")
    rows, cols = 4097, 3001
    x = torch.randn(rows, cols, device="cuda", dtype=F32) * 3
    ref = torch.softmax(x.double(), -1)
    shape, nbytes = f"{rows}x{cols}", 2 * x.numel() * 4
    eager = baselines("small", "softmax", (x, -1), lambda: torch.softmax(x, -1), lambda: opforge.softmax(x, -1),
                      shape, ref, nbytes, 1e-5)
    grid = ((1, 4), (1, 8), (1, 2), (2, 8), (2, 4), (4, 16))
    for br, warps in grid[:4] if quick else grid:
        cfg = {"BLOCK_R": br, "num_warps": warps}

        def run(cfg=cfg):
            y = torch.empty_like(x)
            K.launch_row_forward(x, y, False, cfg)
            return y
        case("small", f"row BLOCK_R={br} {warps}w", shape, run, ref, nbytes, eager, 1e-5,
             ("softmax", "triton_row", (x, -1), cfg))


def scans(quick):
    header("cumsum fp32 (1-D): dispatch (old) vs look-back configs")
    for n in (1 << 28, 1 << 24):
        x = torch.randn(n, device="cuda", dtype=F32)
        ref = torch.cumsum(x.double(), 0)
        shape, nbytes = f"2^{n.bit_length() - 1}", 2 * n * 4
        eager = baselines("cumsum", "cumsum", (x, 0), lambda: torch.cumsum(x, 0), lambda: opforge.cumsum(x, 0),
                          shape, ref, nbytes, 1e-5)
        grid = ((8192, 4), (16384, 8), (8192, 2), (16384, 4), (4096, 2), (16384, 16))
        for late, extra in ((0, {}), (1, {}), (1, {"PACK": 0}), (1, {"ORDERED": 1})):
            some = grid[:1] if extra else grid[:3]
            for block, warps in some if (quick or n < (1 << 28) or extra or not late) else grid:
                cfg = {"BLOCK": block, "num_warps": warps, "WINDOW": 32, "LATE": late, **extra}

                def run(cfg=cfg):
                    y = torch.empty_like(x)
                    SK.launch_lookback_scan(x.view(1, n), y.view(1, n), None, SK.SUM, False, False, cfg)
                    return y
                label = f"lookback LATE={late}{''.join(f' {k}={v}' for k, v in extra.items())} {block}/{warps}w"
                case("cumsum", label, shape, run, ref, nbytes, eager, 1e-5, ("cumsum", "triton_lookback", (x, 0), cfg))
        torch.cuda.empty_cache()


def compaction(quick):
    header("compaction fp32 2^28, keep 1/2 (kernel only: the output preallocated)")
    n = 1 << 28
    x = torch.randn(n, device="cuda", dtype=F32)
    mask = torch.rand(n, device="cuda") < 0.5
    ref = x[mask]
    k = ref.numel()
    shape, nbytes = "2^28", n * 4 + n + k * 4
    eager = ms_of(lambda: x[mask])
    case("compact", "torch eager x[mask]", shape, lambda: x[mask], ref, nbytes, eager, 0.0)
    case("compact", "opforge.compact (sum + sync)", shape, lambda: opforge.compact(x, mask), ref, nbytes, eager, 0.0)
    out = torch.empty(k, device="cuda", dtype=F32)
    grid = ((2048, 4), (4096, 4), (2048, 2), (1024, 2))
    for late, extra in ((0, {}), (1, {}), (1, {"PACK": 0}), (1, {"ORDERED": 1})):
        for block, warps in grid[:1] if extra else (grid[:2] if quick or not late else grid):
            cfg = {"BLOCK": block, "num_warps": warps, "WINDOW": 32, "LATE": late, **extra}

            def run(cfg=cfg):
                SK.launch_compact(x, mask, out, False, cfg)
                return out
            label = f"compact LATE={late}{''.join(f' {k}={v}' for k, v in extra.items())} {block}/{warps}w"
            case("compact", label, shape, run, ref, nbytes, eager, 0.0)


SECTIONS = {"softmax": long_softmax, "norm": long_norms, "small": small_rows, "scan": scans, "compact": compaction}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=",".join(SECTIONS), help="comma-separated: " + ",".join(SECTIONS))
    ap.add_argument("--quick", action="store_true", help="fewer configs and shapes")
    ap.add_argument("--tuned", metavar="JSONL", help="write the fastest passing config of each variant and "
                    "bucket measured here as tuned entries (the format of runtime/tuned/*.jsonl)")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("rows_scan: needs a CUDA GPU")
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__} "
          f"triton {__import__('triton').__version__}; us = median microseconds, %copy = clone of the same bytes")
    global _deadline
    names = [n.strip() for n in a.only.split(",")]
    for i, name in enumerate(names):
        _deadline = time.time() + (T0 + BUDGET_S - time.time()) / (len(names) - i)
        SECTIONS[name](a.quick)
    lines = [e.to_json() + "\n" for e in _entries.values()]
    if a.tuned:
        with open(a.tuned, "w") as f:
            f.writelines(lines)
        print(f"\n{len(lines)} tuned entries -> {a.tuned}")
    else:  # into the log, for runtime/tuned/h200-rows.jsonl
        print(f"\n{len(lines)} tuned entries (the fastest passing config per op, variant and bucket):")
        print("".join("TUNED " + line for line in lines), end="")
    print(f"\ntotal {time.time() - T0:.0f} s")


if __name__ == "__main__":
    main()

"""Where a Nexmark query's time goes: the job runs once unprofiled (dispatch tunes and Triton
compiles what the query meets), then again under ``torch.profiler``. Prints each batch's wall time
in both runs (a batch that tuned or compiled stands out in the first), then the top device kernels
and host ops of the second run by self time.

    python benchmarks/stream_profile.py --query q5 --events 67108864 --batch-size 8388608 --device cuda
                                        [--watermark-granularity record|batch]

``--watermark-granularity`` (default ``record``, the engine's): run it at both to see what
batch-independent event time costs, kernel by kernel.
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from opforge.stream import StreamExecutionEnvironment, vectorized
from opforge.stream.nexmark import QUERIES, NexmarkConfig
from opforge.stream.sinks import Sink


def batch_walls(query: str, config: NexmarkConfig, device, batch_size: int,
                granularity: str = "record") -> list[float]:
    """One run of ``query``; the wall time (ms) between consecutive source batches."""
    stamps: list[float] = []

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def source(env, cfg, kind):
        from opforge.stream.nexmark import stream

        @vectorized
        def stamp(batch):
            sync()
            stamps.append(time.perf_counter())
            return batch

        return stream(env, cfg, kind).map(stamp)

    env = StreamExecutionEnvironment(device=device, batch_size=batch_size, watermark_granularity=granularity)
    QUERIES[query](env, config, source=source).sink_to(_Drop())
    env.execute(f"profile {query}")
    sync()
    stamps.append(time.perf_counter())
    return [round((b - a) * 1000, 3) for a, b in zip(stamps, stamps[1:])]


class _Drop(Sink):
    """A sink that keeps nothing (the profile is of the operators)."""

    def write(self, batch, subtask):
        pass


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--query", default="q5", choices=sorted(QUERIES))
    ap.add_argument("--events", type=int, default=1 << 26)
    ap.add_argument("--batch-size", type=int, default=1 << 23)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--watermark-granularity", default="record", choices=("record", "batch"))
    ap.add_argument("--json", dest="json_path")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    config = NexmarkConfig(events=args.events, events_per_second=10_000, max_out_of_orderness_ms=500)
    g = args.watermark_granularity
    first = batch_walls(args.query, config, device, args.batch_size, g)
    print(f"{args.query} first run, ms between batches: {first}")
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        second = batch_walls(args.query, config, device, args.batch_size, g)
    print(f"{args.query} second run, ms between batches: {second}")
    sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    print(prof.key_averages().table(sort_by=sort, row_limit=args.top))
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.top))
    out = {"query": args.query, "events": args.events, "batch_size": args.batch_size, "device": str(device),
           "watermark_granularity": g,
           "first_run_batch_ms": first, "second_run_batch_ms": second}
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    main()

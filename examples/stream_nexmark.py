"""Nexmark on the stream engine: bids (and persons, auctions) generated on the
device, one query run, its first results and the job's throughput. q5 (hot
items: bid counts per auction in sliding windows, the columnar path) by default.

    python examples/stream_nexmark.py [--device cuda] [--events 1000000] [--query q7]
    opforge stream run examples/stream_nexmark.py [--device cuda] [--events N] [--set query=q8]

``build(env, args)`` is the job for ``opforge stream run``.
"""

import argparse

import torch

from opforge.stream import StreamExecutionEnvironment
from opforge.stream.nexmark import QUERIES, NexmarkConfig

JOB_NAME = "nexmark"
DEFAULT_EVENTS = 200_000


def build(env, args):
    query = getattr(args, "query", "q5")
    if query not in QUERIES:
        raise ValueError(f"stream_nexmark: query must be one of {sorted(QUERIES)}, got {query!r}")
    config = NexmarkConfig(events=args.events or DEFAULT_EVENTS, events_per_second=10_000,
                           max_out_of_orderness_ms=500)
    return QUERIES[query](env, config)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--events", type=int, default=DEFAULT_EVENTS)
    ap.add_argument("--batch-size", type=int, default=65_536)
    ap.add_argument("--query", default="q5", choices=sorted(QUERIES))
    args = ap.parse_args()
    env = StreamExecutionEnvironment(device=args.device, batch_size=args.batch_size)
    sink = build(env, args).collect()
    result = env.execute(f"nexmark {args.query}")
    for r in sink.records()[:10]:
        print(r)
    seconds = result.get_net_runtime() / 1000
    print(f"{args.events} events in {seconds:.2f} s on {args.device}: {args.events / seconds:,.0f} events/s "
          f"(generated in device memory; includes the first-call warm-up)")


if __name__ == "__main__":
    main()

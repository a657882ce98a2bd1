"""Nexmark q5 (hot items) on the stream engine: bids generated on the device,
counted per auction in sliding windows (the columnar path), the hottest
auctions per window printed, and the job's throughput.

    python examples/stream_nexmark.py [--device cuda] [--events 1000000]
"""

import argparse

import torch

from opforge.stream import StreamExecutionEnvironment
from opforge.stream.nexmark import NexmarkConfig, q5


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--batch-size", type=int, default=65_536)
    args = ap.parse_args()
    config = NexmarkConfig(events=args.events, events_per_second=10_000, max_out_of_orderness_ms=500)
    env = StreamExecutionEnvironment(device=args.device, batch_size=args.batch_size)
    sink = q5(env, config).collect()
    result = env.execute("nexmark q5")
    for r in sink.records()[:10]:
        print(r)
    seconds = result.get_net_runtime() / 1000
    print(f"{args.events} events in {seconds:.2f} s on {args.device}: {args.events / seconds:,.0f} events/s "
          f"(generated in device memory; includes the first-call warm-up)")


if __name__ == "__main__":
    main()

"""Stream joins: ad impressions and the clicks that follow them.

An interval join pairs each impression with the clicks on the same ad in the
next 5 s of event time (Flink's ``interval_join``); a window join counts, per
ad and 10 s tumbling window, impressions times clicks (``join().where().equal_to()
.window()``). Runs directly or through the CLI:

    python examples/stream_joins.py [--events 20000]
    opforge stream run examples/stream_joins.py [--events N] [--set join=window]
"""

import argparse
import random

from opforge.stream import (ProcessJoinFunction, StreamExecutionEnvironment, TumblingEventTimeWindows,
                            WatermarkStrategy)

JOB_NAME = "ad clicks"
OUT_OF_ORDERNESS_MS = 200


def events(n: int, seed: int = 7):
    """``n`` impressions ``{ad, user, ts}``; a quarter of them get a click 0-8 s later."""
    rng = random.Random(seed)
    impressions, clicks = [], []
    for i in range(n):
        ts = i * 10 + rng.randint(0, OUT_OF_ORDERNESS_MS)
        imp = {"ad": rng.randrange(50), "user": rng.randrange(1000), "ts": ts}
        impressions.append(imp)
        if rng.random() < 0.25:
            clicks.append({"ad": imp["ad"], "user": imp["user"], "ts": ts + rng.randint(0, 8000)})
    clicks.sort(key=lambda c: c["ts"] + rng.randint(0, OUT_OF_ORDERNESS_MS))
    return impressions, clicks


class ClickThrough(ProcessJoinFunction):
    def process_element(self, impression, click, ctx):
        if impression["user"] == click["user"]:
            yield {"ad": impression["ad"], "user": click["user"], "delay_ms": click["ts"] - impression["ts"]}


def build(env, args):
    impressions, clicks = events(args.events or 20_000)
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(OUT_OF_ORDERNESS_MS).with_timestamp_assigner("ts")
    imp = env.from_collection(impressions, strategy)
    clk = env.from_collection(clicks, strategy)
    if getattr(args, "join", "interval") == "window":
        return imp.join(clk).where("ad").equal_to("ad").window(TumblingEventTimeWindows.of(10_000)) \
            .apply(lambda i, c: (i["ad"], i["user"] == c["user"]))
    return imp.key_by("ad").interval_join(clk.key_by("ad")).between(0, 5_000).process(ClickThrough())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=20_000)
    ap.add_argument("--join", choices=["interval", "window"], default="interval")
    args = ap.parse_args()
    env = StreamExecutionEnvironment(batch_size=4096)
    sink = build(env, args).collect()
    result = env.execute(JOB_NAME)
    records = sink.records()
    for r in records[:5]:
        print(r)
    print(f"{len(records)} joined records in {result.get_net_runtime():.0f} ms")


if __name__ == "__main__":
    main()

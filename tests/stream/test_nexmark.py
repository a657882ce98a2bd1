"""Nexmark: the generator's shape and q0/q1/q2/q5 against plain Python over
the same generated events."""

import pytest

from opforge.stream import StreamExecutionEnvironment
from opforge.stream.nexmark import NexmarkConfig, NexmarkSource, generate, q0, q1, q2, q5
from stream_helpers import multiset

CONFIG = NexmarkConfig(events=20_000, events_per_second=1000, max_out_of_orderness_ms=300, seed=3)


def all_bids(config=CONFIG):
    return generate(config, "bid", 0, config.events, "cpu").records()


def run(query, parallelism=2, batch_size=1000, config=CONFIG):
    env = StreamExecutionEnvironment(parallelism=parallelism, batch_size=batch_size)
    sink = query(env, config).collect()
    env.execute(query.__name__)
    return sink.records()


def test_generator_proportions_ids_and_skew():
    b = all_bids()
    p = generate(CONFIG, "person", 0, CONFIG.events, "cpu").records()
    a = generate(CONFIG, "auction", 0, CONFIG.events, "cpu").records()
    assert (len(p), len(a), len(b)) == (400, 1200, 18400)
    assert [r["id"] for r in a] == list(range(1000, 2200))
    assert [r["id"] for r in p] == list(range(1000, 1400))
    # a bid names an auction that exists when the bid is made
    assert all(1000 <= r["auction"] <= 2199 for r in b)
    # out of order, never by more than the configured bound
    ts = [r["date_time"] for r in b]
    running = [max(ts[:1])]
    for t in ts[1:]:
        running.append(max(running[-1], t))
    behind = [m - t for m, t in zip(running, ts)]
    assert 0 < max(behind) <= CONFIG.max_out_of_orderness_ms


def test_generation_does_not_depend_on_batching():
    whole = generate(CONFIG, "bid", 0, 5000, "cpu").records()
    parts = generate(CONFIG, "bid", 0, 1234, "cpu").records() + generate(CONFIG, "bid", 1234, 5000, "cpu").records()
    assert whole == parts
    with pytest.raises(ValueError, match="kind"):
        NexmarkSource(CONFIG, "seller")


def test_q0_q1_q2():
    bids = all_bids()
    assert multiset(run(q0)) == multiset(bids)
    assert multiset(run(q1)) == multiset([{**r, "price": r["price"] * 0.908} for r in bids])
    want = [{"auction": r["auction"], "price": r["price"]} for r in bids if r["auction"] % 123 == 0]
    assert want and multiset(run(q2)) == multiset(want)


def test_q5_hot_items():
    config = NexmarkConfig(events=6000, events_per_second=500, max_out_of_orderness_ms=200, seed=1)
    counts = {}
    for r in all_bids(config):
        t = r["date_time"]
        start = t - t % 2000
        while start > t - 10_000:
            counts.setdefault(start, {}).setdefault(r["auction"], 0)
            counts[start][r["auction"]] += 1
            start -= 2000
    want = []
    for start, per_auction in counts.items():
        top = max(per_auction.values())
        want += [{"auction": a, "num": top, "window_start": start, "window_end": start + 10_000}
                 for a, n in per_auction.items() if n == top]
    assert multiset(run(q5, config=config, batch_size=500)) == multiset(want)

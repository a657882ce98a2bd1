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


def _masked_reference(config, kind, first, last):
    """The generator as first written: all events made, then masked by kind."""
    import torch

    from opforge.ops.nexmark import AUCTION, FIRST_ID, PERSON, PROPORTION
    from opforge.stream.partitioning import hash_keys

    def _uniform(n, salt, seed):
        return hash_keys(n * 8 + salt + seed * 1_000_003)

    n = torch.arange(first, last, dtype=torch.int64)
    off = n % PROPORTION
    mask = {"person": off < PERSON, "auction": (off >= PERSON) & (off < AUCTION + PERSON),
            "bid": off >= AUCTION + PERSON}[kind]
    n, off = n[mask], off[mask]
    epoch, seed = n // PROPORTION, config.seed
    bound = config.max_out_of_orderness_ms
    ts = n * 1000 // config.events_per_second + bound - _uniform(n, 0, seed) % (bound + 1)
    last_person = FIRST_ID + epoch * PERSON
    last_auction = FIRST_ID + epoch * AUCTION + (off - PERSON).clamp(0, AUCTION - 1)
    if kind == "person":
        return {"id": FIRST_ID + epoch * PERSON + off, "state": _uniform(n, 1, seed) % 50,
                "city": _uniform(n, 2, seed) % 1000, "date_time": ts}
    if kind == "auction":
        initial = 100 + _uniform(n, 3, seed) % 10_000
        return {"id": last_auction, "seller": FIRST_ID + _uniform(n, 4, seed) % (last_person - FIRST_ID + 1),
                "category": 10 + _uniform(n, 5, seed) % 5, "initial_bid": initial,
                "reserve": initial + _uniform(n, 6, seed) % 1000, "date_time": ts,
                "expires": ts + 10_000 + _uniform(n, 7, seed) % 20_000}
    hot = (_uniform(n, 8, seed) % 1000) < int(config.hot_ratio * 1000)
    back = _uniform(n, 9, seed) % config.auctions_in_flight
    auction = torch.where(hot, last_auction, (last_auction - back).clamp_min(FIRST_ID))
    return {"auction": auction, "bidder": FIRST_ID + _uniform(n, 10, seed) % (last_person - FIRST_ID + 1),
            "price": 100 + _uniform(n, 11, seed) % 10_000, "date_time": ts}


@pytest.mark.parametrize("kind", ["person", "auction", "bid"])
def test_direct_generator_equals_the_masked_one(kind):
    """The generator computes each kind's event numbers directly and hashes all
    columns at once (no boolean mask, no sync): the same events, any range."""
    import torch

    for config in (NexmarkConfig(events=10_000, max_out_of_orderness_ms=500),
                   NexmarkConfig(events=10_000, seed=3, auctions_in_flight=7, hot_ratio=0.2)):
        for first, last in [(0, 10_000), (7, 333), (49, 51), (1234, 9999), (3, 3), (0, 1), (50, 100)]:
            got = generate(config, kind, first, last, "cpu")
            want = _masked_reference(config, kind, first, last)
            assert list(got.columns) == list(want)
            for name, col in want.items():
                assert torch.equal(got[name], col), (kind, first, last, name)
            assert torch.equal(got.timestamps, want["date_time"])


def test_top_rows_are_exactly_the_group_tops_in_any_order():
    """``_top_rows`` (the device pre-filter of q5 and q7) keeps exactly each group's top rows, in row
    order, whether the batch is in group order or not, and for groups both narrow (the dense table)
    and spread wider than the batch (numbered by ``torch.unique``)."""
    import torch

    from opforge.stream.nexmark import _top_rows

    gen = torch.Generator().manual_seed(7)
    value = torch.randint(0, 5, (400,), generator=gen)

    def tops(g, v):
        return [i for i in range(len(g)) if v[i] == v[g == g[i]].max()]

    narrow = torch.randint(-3, 6, (400,), generator=gen)
    wide = narrow * 1_000_003
    for group in (narrow, wide, narrow[torch.argsort(narrow, stable=True)]):
        assert _top_rows(group, value).tolist() == tops(group, value)
    assert _top_rows(narrow[:0], value[:0]).tolist() == []

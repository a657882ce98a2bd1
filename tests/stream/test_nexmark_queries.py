"""Nexmark q3, q4, q7, q8 against pandas over the same generated events; the
micro-batch size and parallelism do not change results, nor does a
permutation of the input within the out-of-orderness bound."""

import random

import pandas as pd
import pytest

from opforge.stream import StreamExecutionEnvironment, WatermarkStrategy
from opforge.stream.nexmark import STATES, NexmarkConfig, generate, q3, q4, q7, q8
from stream_helpers import multiset

CONFIG = NexmarkConfig(events=30_000, events_per_second=1000, max_out_of_orderness_ms=300, seed=5)
SIZE = 10_000


def frame(kind, config=CONFIG):
    return pd.DataFrame(generate(config, kind, 0, config.events, "cpu").records())


def run(query, config=CONFIG, parallelism=2, batch_size=1000, source=None):
    env = StreamExecutionEnvironment(parallelism=parallelism, batch_size=batch_size)
    stream = query(env, config) if source is None else query(env, config, source=source)
    sink = stream.collect()
    env.execute(query.__name__)
    return sink.records()


# -- pandas oracles ----------------------------------------------------------------

def want_q3(config=CONFIG):
    p, a = frame("person", config), frame("auction", config)
    p = p[p["state"].isin([STATES.index(s) for s in ("OR", "ID", "CA")])]
    a = a[a["category"] == 10]
    j = a.merge(p, left_on="seller", right_on="id", suffixes=("_a", "_p"))
    return [{"person": int(r.id_p), "city": int(r.city), "state": int(r.state), "auction": int(r.id_a)}
            for r in j.itertuples()]


def want_q4_winners(config=CONFIG):
    a, b = frame("auction", config), frame("bid", config)
    j = b.merge(a, left_on="auction", right_on="id", suffixes=("_b", "_a"))
    j = j[(j["date_time_b"] >= j["date_time_a"]) & (j["date_time_b"] <= j["expires"])]
    return j.groupby(["auction", "category"])["price"].max().reset_index()


def want_q7(config=CONFIG):
    b = frame("bid", config)
    b["window"] = b["date_time"] - b["date_time"] % SIZE
    top = b.groupby("window")["price"].transform("max")
    return b[b["price"] == top][["auction", "price", "bidder", "date_time"]].to_dict("records")


def want_q8(config=CONFIG):
    p, a = frame("person", config), frame("auction", config)
    p["start"] = p["date_time"] - p["date_time"] % SIZE
    a["start"] = a["date_time"] - a["date_time"] % SIZE
    sellers = a[["seller", "start"]].drop_duplicates()
    j = p.merge(sellers, left_on=["id", "start"], right_on=["seller", "start"])
    return [{"id": int(r.id), "window_start": int(r.start), "window_end": int(r.start) + SIZE}
            for r in j.itertuples()]


def final_q4(updates):
    """The last update per category (the one that counts the most auctions)."""
    last = {}
    for u in updates:
        if u["category"] not in last or u["auctions"] > last[u["category"]]["auctions"]:
            last[u["category"]] = u
    return last


def check_q4(updates, config=CONFIG):
    winners = want_q4_winners(config)
    by_cat = winners.groupby("category")["price"].agg(["sum", "count"])
    want = {int(c): {"category": int(c), "avg": int(r["sum"]) / int(r["count"]), "auctions": int(r["count"])}
            for c, r in by_cat.iterrows()}
    assert final_q4(updates) == want
    # one update per winning auction, counts 1..n per category
    assert len(updates) == len(winners)
    for c, w in want.items():
        assert sorted(u["auctions"] for u in updates if u["category"] == c) == list(range(1, w["auctions"] + 1))


def test_q3_local_item_suggestion():
    want = want_q3()
    assert len(want) >= 10
    assert multiset(run(q3)) == multiset(want)


def test_q4_average_price_per_category():
    check_q4(run(q4))


def test_q7_highest_bid():
    want = want_q7()
    got = run(q7)
    assert len({r["date_time"] - r["date_time"] % SIZE for r in want}) >= 3
    assert multiset(got) == multiset(want)


def test_q8_new_users():
    want = want_q8()
    assert len(want) >= 20
    assert multiset(run(q8)) == multiset(want)


@pytest.mark.parametrize("seed", range(3))
def test_batch_size_and_parallelism_do_not_change_results(seed):
    rng = random.Random(seed)
    config = NexmarkConfig(events=12_000, events_per_second=1000, max_out_of_orderness_ms=rng.choice([0, 150, 400]),
                           seed=seed)
    for query, want in ((q3, want_q3), (q7, want_q7), (q8, want_q8)):
        batch_size, parallelism = rng.randint(50, 3000), rng.randint(1, 3)
        got = run(query, config, parallelism=parallelism, batch_size=batch_size)
        assert multiset(got) == multiset(want(config)), (query.__name__, batch_size, parallelism)
    check_q4(run(q4, config, parallelism=rng.randint(1, 3), batch_size=rng.randint(50, 3000)), config)


def permuted_source(config, bound, seed):
    """Each kind's events in order, then shuffled within ``bound / 2`` ms of
    event time: never behind the running maximum by ``bound`` or more."""
    rng = random.Random(seed)
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(bound).with_timestamp_assigner("date_time")
    events = {}
    for kind in ("person", "auction", "bid"):
        recs = generate(config, kind, 0, config.events, "cpu").records()
        events[kind] = [r for _, r in sorted(((r["date_time"] + rng.uniform(0, bound / 2), r) for r in recs),
                                             key=lambda p: p[0])]

    def source(env, config, kind):
        return env.from_collection(events[kind], strategy)

    return source, events


@pytest.mark.parametrize("seed", [0, 1])
def test_permutations_within_the_bound_give_the_same_windows(seed):
    config = NexmarkConfig(events=12_000, events_per_second=1000, max_out_of_orderness_ms=0, seed=seed)
    source, events = permuted_source(config, bound=600, seed=seed)
    assert [r["date_time"] for r in events["bid"]] != sorted(r["date_time"] for r in events["bid"])
    for query, want in ((q7, want_q7), (q8, want_q8), (q3, want_q3)):
        in_order = run(query, config)
        assert multiset(in_order) == multiset(want(config))
        assert multiset(run(query, config, batch_size=777, source=source)) == multiset(in_order), query.__name__
    check_q4(run(q4, config, batch_size=500, source=source), config)


def test_demo_stream_step_checks_q7_against_plain_python():
    import io

    import torch
    from rich.console import Console

    from opforge.demo import stream_step

    buf = io.StringIO()
    assert stream_step(Console(file=buf, width=200), torch.device("cpu"), events=20_000) is True
    text = buf.getvalue()
    assert "same answer as plain Python" in text and "events/s" in text and "window" in text

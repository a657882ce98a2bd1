"""Connected streams: a keyed co-process function sees both inputs of a key
with shared state and timers."""

import pytest

from opforge.stream import (CoProcessFunction, KeyedCoProcessFunction, ListStateDescriptor,
                            StreamExecutionEnvironment, ValueStateDescriptor, WatermarkStrategy)
from opforge.stream.reference import run_reference
from stream_helpers import multiset, out_of_order_events


class Enrich(KeyedCoProcessFunction):
    """Bids wait in list state until their auction's seller is known."""

    def open(self, ctx):
        self.seller = ctx.get_state(ValueStateDescriptor("seller"))
        self.waiting = ctx.get_list_state(ListStateDescriptor("waiting"))

    def process_element1(self, auction, ctx):
        self.seller.update(auction["seller"])
        for price in self.waiting.get():
            yield (ctx.get_current_key(), auction["seller"], price)
        self.waiting.clear()

    def process_element2(self, bid, ctx):
        seller = self.seller.value()
        if seller is None:
            self.waiting.add(bid[1])
        else:
            yield (ctx.get_current_key(), seller, bid[1])


@pytest.mark.parametrize("parallelism", [1, 3])
def test_keyed_connect_joins_two_sources_with_string_keys(parallelism):
    auctions = [{"name": f"item{i}", "seller": i * 10} for i in range(12)]
    bids = [(f"item{i % 12}", p) for i, p in enumerate(range(100, 160))]
    env = StreamExecutionEnvironment(parallelism=parallelism, batch_size=5)
    a = env.from_collection(auctions)
    b = env.from_collection(bids)
    sink = a.connect(b).key_by("name", lambda bid: bid[0]).process(Enrich()).collect()
    env.execute()
    want = [(name, int(name[4:]) * 10, price) for name, price in bids]
    assert multiset(sink.records()) == multiset(want)


class Race(KeyedCoProcessFunction):
    """Counts each side per key; a timer 25 ms after a record of the second
    input reports both counts."""

    def open(self, ctx):
        self.left = ctx.get_state(ValueStateDescriptor("left"))
        self.right = ctx.get_state(ValueStateDescriptor("right"))

    def process_element1(self, value, ctx):
        self.left.update((self.left.value() or 0) + 1)
        return ()

    def process_element2(self, value, ctx):
        self.right.update((self.right.value() or 0) + 1)
        ctx.timer_service().register_event_time_timer(ctx.timestamp() + 25)
        yield ("right", ctx.get_current_key(), self.right.value())

    def on_timer(self, ts, ctx):
        yield ("timer", ctx.get_current_key(), ts, self.left.value() or 0, self.right.value())


EVENTS = out_of_order_events(200, keys=4, bound=15, seed=9, late=0.05)


def race_job(env):
    s = WatermarkStrategy.for_bounded_out_of_orderness(15).with_timestamp_assigner("f2")
    src = env.from_collection(EVENTS, s)
    # filters next to the source keep each key's order (a rebalance would not)
    evens = src.filter(lambda r: r[1] % 2 == 0).set_parallelism(1)
    odds = src.filter(lambda r: r[1] % 2 != 0).set_parallelism(1)
    return evens.connect(odds).key_by(0, 0).process(Race()).collect()


def race(parallelism, batch_size):
    env = StreamExecutionEnvironment(parallelism=parallelism, batch_size=batch_size)
    sink = race_job(env)
    env.execute()
    return multiset(zip(sink.records(), sink.timestamps()))


@pytest.mark.parametrize("parallelism,batch_size", [(1, 3), (3, 16)])
def test_connected_timers_match_the_reference(parallelism, batch_size):
    # record granularity: both inputs' records meet in the source's order, as in the reference
    ref_env = StreamExecutionEnvironment(batch_size=batch_size)
    ref_sink = race_job(ref_env)
    want = multiset(run_reference(ref_env)[ref_sink])
    assert race(parallelism, batch_size) == want
    assert any(r[0][0] == "timer" for r in want)


def test_connected_timers_do_not_depend_on_the_batch_size():
    """The timer reports counts of both inputs: with per-batch watermarks they
    depend on where batches end; with record watermarks they do not."""
    results = {repr(race(1, b)) for b in (1, 8, 200)}
    assert len(results) == 1


def test_unkeyed_connect_and_mixed_keying_is_an_error():
    class Tag(CoProcessFunction):
        def process_element1(self, value, ctx):
            yield ("a", value)

        def process_element2(self, value, ctx):
            yield ("b", value)

    env = StreamExecutionEnvironment(batch_size=2)
    a, b = env.from_collection([1, 2, 3]), env.from_collection([4])
    sink = a.connect(b).process(Tag()).collect()
    env.execute()
    assert sorted(sink.records()) == [("a", 1), ("a", 2), ("a", 3), ("b", 4)]
    with pytest.raises(ValueError, match="key both inputs"):
        a.key_by(lambda x: x).connect(b).process(Tag())
    with pytest.raises(TypeError, match="CoProcessFunction"):
        a.connect(b).process(lambda x: x)

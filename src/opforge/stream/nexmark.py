"""A Nexmark-shaped event generator and queries q0, q1, q2, q3, q4, q5, q7, q8.

Nexmark models an online auction: people register, open auctions and bid.
Event ``n`` of the global sequence is, by ``n mod 50``, a person (1 in 50),
an auction (3) or a bid (46) — the benchmark's proportions; ids start at 1000
and a bid goes to one of the ``auctions_in_flight`` newest auctions (a
``hot_ratio`` share to the newest, the hot one). Event ``n`` happens at
``n * 1000 / events_per_second`` ms, then is delayed by up to
``max_out_of_orderness_ms`` (the event-time skew). All columns are numeric and
made on the device in whole batches, so a query's throughput is the engine's,
not Python's. Not bit-compatible with the Java generator (no strings: names,
channels and URLs are omitted; a person's ``state`` is an index into
``STATES``); the query semantics are Nexmark's (Flink's nexmark SQL).

* q0 — pass-through of bids (the framework's overhead).
* q1 — currency conversion: ``price * 0.908`` (dollars to euros).
* q2 — selection: bids on auctions with ``auction % 123 == 0``.
* q3 — local item suggestion: persons in OR, ID or CA joined with the
  category-10 auctions they sell (``auction.seller = person.id``), an
  incremental (regular, unwindowed) join: each match is emitted once, when
  its second side arrives.
* q4 — average winning price per category: an auction's winning bid is its
  highest bid with ``auction.date_time <= bid.date_time <= auction.expires``,
  known when the watermark passes ``expires`` (the auction closes); each
  closed auction updates its category's running average. The last update per
  category is the SQL query's answer.
* q5 — hot items: per sliding window (10 s every 2 s), the auctions with the
  most bids.
* q7 — highest bid: per tumbling window (10 s), the bids with the highest price
  (all of them on a tie).
* q8 — monitor new users: people who registered and opened an auction in the
  same tumbling window (10 s), once per person and window: a window join of
  persons with the distinct sellers of the window.

Every query takes ``source(env, config, kind) -> DataStream`` (default:
``stream``, events made on the device), so tests and benchmarks can feed the
same events from elsewhere (host memory, Arrow, a permuted list).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from opforge.stream.functions import (Aggregations, KeyedCoProcessFunction, KeyedProcessFunction,
                                      ProcessWindowFunction, vectorized)
from opforge.stream.records import Batch, RecordSchema
from opforge.stream.state import ListStateDescriptor, ValueStateDescriptor
from opforge.stream.sources import RangeSplit, Source
from opforge.stream.time import WatermarkStrategy
from opforge.stream.windows import SlidingEventTimeWindows, TumblingEventTimeWindows

PROPORTION = 50
PERSON, AUCTION = 1, 3  # offsets < 1: person, < 4: auction, else bid
FIRST_ID = 1000
STATES = ("AL", "AK", "AZ", "AR", "CA", "CO", "CT", "DE", "FL", "GA", "HI", "ID", "IL", "IN", "IA", "KS", "KY",
          "LA", "ME", "MD", "MA", "MI", "MN", "MS", "MO", "MT", "NE", "NV", "NH", "NJ", "NM", "NY", "NC", "ND",
          "OH", "OK", "OR", "PA", "RI", "SC", "SD", "TN", "TX", "UT", "VT", "VA", "WA", "WV", "WI", "WY")
FIELDS = {
    "person": ("id", "state", "city", "date_time"),
    "auction": ("id", "seller", "category", "initial_bid", "reserve", "date_time", "expires"),
    "bid": ("auction", "bidder", "price", "date_time"),
}


@dataclass(frozen=True)
class NexmarkConfig:
    events: int = 100_000
    events_per_second: int = 10_000
    max_out_of_orderness_ms: int = 0
    auctions_in_flight: int = 100
    hot_ratio: float = 0.5
    seed: int = 0

    def watermark_strategy(self) -> WatermarkStrategy:
        return WatermarkStrategy.for_bounded_out_of_orderness(self.max_out_of_orderness_ms) \
            .with_timestamp_assigner("date_time")


def _uniform(n: torch.Tensor, salt: int, seed: int) -> torch.Tensor:
    """A reproducible pseudo-random int in [0, 2^31) per event number (a hash:
    any batch split gives the same events)."""
    from opforge.stream.partitioning import hash_keys

    return hash_keys(n * 8 + salt + seed * 1_000_003)


def generate(config: NexmarkConfig, kind: str, first: int, last: int, device) -> Batch:
    """The ``kind`` events among global events ``[first, last)``, in order."""
    if kind not in FIELDS:
        raise ValueError(f"nexmark: kind must be one of {list(FIELDS)}, got {kind!r}")
    n = torch.arange(first, last, dtype=torch.int64, device=device)
    off = n % PROPORTION
    mask = {"person": off < PERSON, "auction": (off >= PERSON) & (off < AUCTION + PERSON),
            "bid": off >= AUCTION + PERSON}[kind]
    n, off = n[mask], off[mask]
    epoch = n // PROPORTION
    seed = config.seed
    delay = _uniform(n, 0, seed) % (config.max_out_of_orderness_ms + 1)
    ts = n * 1000 // config.events_per_second - delay
    last_person = FIRST_ID + epoch * PERSON  # newest person id at this event
    last_auction = FIRST_ID + epoch * AUCTION + (off - PERSON).clamp(0, AUCTION - 1)
    if kind == "person":
        cols = {"id": FIRST_ID + epoch * PERSON + off, "state": _uniform(n, 1, seed) % 50,
                "city": _uniform(n, 2, seed) % 1000, "date_time": ts}
    elif kind == "auction":
        initial = 100 + _uniform(n, 3, seed) % 10_000
        cols = {"id": last_auction, "seller": FIRST_ID + _uniform(n, 4, seed) % (last_person - FIRST_ID + 1),
                "category": 10 + _uniform(n, 5, seed) % 5, "initial_bid": initial,
                "reserve": initial + _uniform(n, 6, seed) % 1000, "date_time": ts,
                "expires": ts + 10_000 + _uniform(n, 7, seed) % 20_000}
    else:
        hot = (_uniform(n, 8, seed) % 1000) < int(config.hot_ratio * 1000)
        back = _uniform(n, 9, seed) % config.auctions_in_flight
        auction = torch.where(hot, last_auction, (last_auction - back).clamp_min(FIRST_ID))
        cols = {"auction": auction, "bidder": FIRST_ID + _uniform(n, 10, seed) % (last_person - FIRST_ID + 1),
                "price": 100 + _uniform(n, 11, seed) % 10_000, "date_time": ts}
    return Batch(cols, ts.clone(), RecordSchema("dict", FIELDS[kind]))


class NexmarkSource(Source):
    """The ``kind`` stream (person / auction / bid) of ``config.events`` global
    events; each subtask makes a contiguous range, ``batch_size`` events at a time."""

    def __init__(self, config: NexmarkConfig, kind: str = "bid"):
        if kind not in FIELDS:
            raise ValueError(f"NexmarkSource: kind must be one of {list(FIELDS)}, got {kind!r}")
        self.config, self.kind = config, kind

    def splits(self, parallelism, batch_size, device):
        total = self.config.events
        bounds = [total * i // parallelism for i in range(parallelism + 1)]

        def make(s, e):
            return generate(self.config, self.kind, s, e, device)

        # a RangeSplit: its position (the next event number) is checkpointed
        return [RangeSplit(bounds[i], bounds[i + 1], batch_size, make) for i in range(parallelism)]


def stream(env, config: NexmarkConfig, kind: str):
    """The ``kind`` events made on the device (the queries' default ``source``)."""
    return env.from_source(NexmarkSource(config, kind), config.watermark_strategy(), f"Nexmark {kind}s")


def bids(env, config: NexmarkConfig, source=stream):
    return source(env, config, "bid")


@vectorized
def _identity(batch):
    return batch


@vectorized
def _to_euros(batch):
    return {"auction": batch["auction"], "bidder": batch["bidder"], "price": batch["price"].to(torch.float64) * 0.908,
            "date_time": batch["date_time"]}


@vectorized
def _auction_mod_123(batch):
    return batch["auction"] % 123 == 0


@vectorized
def _auction_price(batch):
    return {"auction": batch["auction"], "price": batch["price"]}


def q0(env, config: NexmarkConfig, source=stream):
    return bids(env, config, source).map(_identity)


def q1(env, config: NexmarkConfig, source=stream):
    return bids(env, config, source).map(_to_euros)


def q2(env, config: NexmarkConfig, source=stream):
    return bids(env, config, source).filter(_auction_mod_123).map(_auction_price)


class _HottestAuctions(ProcessWindowFunction):
    def process(self, key, context, elements):
        top = max(e["num"] for e in elements)
        for e in sorted(elements, key=lambda e: e["key"]):
            if e["num"] == top:
                yield {"auction": e["key"], "num": top, "window_start": e["window_start"],
                       "window_end": e["window_end"]}


def q5(env, config: NexmarkConfig, size_ms: int = 10_000, slide_ms: int = 2_000, source=stream):
    """Bid counts per auction and sliding window (the columnar path), then, per
    window (all its counts carry the time ``end - 1``), the auctions with the most."""
    counts = bids(env, config, source).key_by("auction").window(SlidingEventTimeWindows.of(size_ms, slide_ms)) \
        .aggregate(Aggregations(with_window=True, num=("count",)))
    return counts.key_by("window_end").window(TumblingEventTimeWindows.of(slide_ms)).process(_HottestAuctions())


# -- q3: local item suggestion (an incremental join) ------------------------------

Q3_STATES = tuple(STATES.index(s) for s in ("OR", "ID", "CA"))
Q3_CATEGORY = 10


@vectorized
def _q3_person(batch):
    state = batch["state"]
    keep = torch.zeros_like(state, dtype=torch.bool)
    for code in Q3_STATES:
        keep |= state == code
    return keep


@vectorized
def _q3_auction(batch):
    return batch["category"] == Q3_CATEGORY


class _LocalItemSuggestion(KeyedCoProcessFunction):
    """person.id = auction.seller, a regular join: the person (ids are unique)
    stays in value state for the whole stream; an auction that comes before
    its seller waits in list state (state is never expired, as in Flink SQL's
    join without a state TTL)."""

    def open(self, ctx):
        self.person = ctx.get_state(ValueStateDescriptor("person"))
        self.waiting = ctx.get_list_state(ListStateDescriptor("auctions"))

    def process_element1(self, person, ctx):
        self.person.update((person["city"], person["state"]))
        for auction in self.waiting.get():
            yield _q3_row(person["id"], person["city"], person["state"], auction)
        self.waiting.clear()

    def process_element2(self, auction, ctx):
        p = self.person.value()
        if p is None:
            self.waiting.add(auction["id"])
        else:
            yield _q3_row(auction["seller"], p[0], p[1], auction["id"])


def _q3_row(person, city, state, auction):
    return {"person": person, "city": city, "state": state, "auction": auction}


def q3(env, config: NexmarkConfig, source=stream):
    """``SELECT P.id, P.city, P.state, A.id FROM auction A JOIN person P ON A.seller = P.id
    WHERE A.category = 10 AND P.state IN ('OR', 'ID', 'CA')`` (name omitted)."""
    persons = source(env, config, "person").filter(_q3_person)
    auctions = source(env, config, "auction").filter(_q3_auction)
    return persons.connect(auctions).key_by("id", "seller").process(_LocalItemSuggestion()).name("Q3Join")


# -- q4: average price per category ----------------------------------------------

class _WinningBids(KeyedCoProcessFunction):
    """Per auction id: the highest valid bid (``auction.date_time <= bid.date_time
    <= auction.expires``), emitted when the watermark passes ``expires`` (the
    auction closes). Bids that come before their auction wait in list state; a
    waiting bid is dropped once the watermark passes its time (its auction,
    which is not later than the bid, could then only be late)."""

    def open(self, ctx):
        self.auction = ctx.get_state(ValueStateDescriptor("auction"))
        self.best = ctx.get_state(ValueStateDescriptor("best"))
        self.waiting = ctx.get_list_state(ListStateDescriptor("early-bids"))

    def process_element1(self, auction, ctx):
        a = (auction["category"], auction["date_time"], auction["expires"])
        self.auction.update(a)
        best = None
        for price, t in self.waiting.get():
            if a[1] <= t <= a[2] and (best is None or price > best):
                best = price
        self.waiting.clear()
        if best is not None:
            self.best.update(best)
        ctx.timer_service().register_event_time_timer(a[2])
        return ()

    def process_element2(self, bid, ctx):
        a = self.auction.value()
        price, t = bid["price"], bid["date_time"]
        if a is None:
            self.waiting.add((price, t))
            ctx.timer_service().register_event_time_timer(t + 1)
        elif a[1] <= t <= a[2]:
            best = self.best.value()
            if best is None or price > best:
                self.best.update(price)
        return ()

    def on_timer(self, timestamp, ctx):
        a = self.auction.value()
        if a is not None and timestamp == a[2]:
            best = self.best.value()
            if best is not None:
                yield {"auction": ctx.get_current_key(), "category": a[0], "price": best}
            self.auction.clear()
            self.best.clear()
        elif a is None:
            self.waiting.update([b for b in self.waiting.get() if b[1] + 1 > timestamp])


class _AveragePrice(KeyedProcessFunction):
    """A category's running average of winning prices."""

    def open(self, ctx):
        self.total = ctx.get_state(ValueStateDescriptor("sum-count"))

    def process_element(self, winner, ctx):
        total, count = self.total.value() or (0, 0)
        total, count = total + winner["price"], count + 1
        self.total.update((total, count))
        yield {"category": winner["category"], "avg": total / count, "auctions": count}


def q4(env, config: NexmarkConfig, source=stream):
    """``SELECT category, AVG(final) FROM (SELECT MAX(B.price) AS final, A.category FROM
    auction A, bid B WHERE A.id = B.auction AND B.date_time BETWEEN A.date_time AND
    A.expires GROUP BY A.id, A.category) GROUP BY category`` as a stream of updates
    ``{category, avg, auctions}``, one per closed auction that had a valid bid."""
    auctions = source(env, config, "auction")
    winners = auctions.connect(bids(env, config, source)).key_by("id", "auction") \
        .process(_WinningBids()).name("Q4WinningBids")
    return winners.key_by("category").process(_AveragePrice()).name("Q4Average")


# -- q7: highest bid ------------------------------------------------------------------

def _batch_top(size_ms: int):
    @vectorized
    def top_of_batch(batch):
        """Per tumbling window, this batch's bids at the batch's top price: a
        window's top bids overall are among them (a pre-filter on the device;
        the rows of one window in one batch are all late or none are)."""
        ts, price = batch.timestamps, batch["price"]
        _, inv = torch.unique(ts - torch.remainder(ts, size_ms), return_inverse=True)
        low = float("-inf") if price.dtype.is_floating_point else torch.iinfo(price.dtype).min
        groups = int(inv.max()) + 1 if len(inv) else 0
        top = torch.full((groups,), low, dtype=price.dtype, device=price.device)
        top = top.scatter_reduce(0, inv, price, "amax")
        rows = torch.nonzero(price == top[inv]).flatten()
        return {"auction": batch["auction"][rows], "price": price[rows], "bidder": batch["bidder"][rows],
                "date_time": batch["date_time"][rows], "__row__": rows}

    return top_of_batch


@vectorized
def _one_key(batch):
    return torch.zeros(len(batch), dtype=torch.int64, device=batch.device)


class _HighestBids(ProcessWindowFunction):
    def process(self, key, context, elements):
        top = max(e["price"] for e in elements)
        for e in elements:
            if e["price"] == top:
                yield {"auction": e["auction"], "price": e["price"], "bidder": e["bidder"],
                       "date_time": e["date_time"]}


def q7(env, config: NexmarkConfig, size_ms: int = 10_000, source=stream):
    """The bids at the highest price of their tumbling window (``SELECT B.* FROM bid B
    JOIN (SELECT MAX(price) AS maxprice, TUMBLE_ROWTIME(...) ...) ON B.price = maxprice``
    with the bid in that window)."""
    return bids(env, config, source).flat_map(_batch_top(size_ms)).key_by(_one_key) \
        .window(TumblingEventTimeWindows.of(size_ms)).process(_HighestBids()).name("Q7HighestBids")


# -- q8: monitor new users (a window join) ------------------------------------

def _new_user(person, seller):
    return {"id": person["id"], "window_start": seller["window_start"], "window_end": seller["window_end"]}


def q8(env, config: NexmarkConfig, size_ms: int = 10_000, source=stream):
    """``SELECT P.id, P.starttime FROM (persons per tumbling window) P JOIN (distinct
    sellers per tumbling window) A ON P.id = A.seller AND P.starttime = A.starttime``
    (name omitted). The distinct sellers of a window come from the columnar window
    aggregation (its results carry the window's time ``end - 1``), then a window
    join with the persons."""
    window = TumblingEventTimeWindows.of(size_ms)
    sellers = source(env, config, "auction").key_by("seller").window(window) \
        .aggregate(Aggregations(with_window=True, auctions=("count",)))
    return source(env, config, "person").join(sellers).where("id").equal_to("key").window(window) \
        .apply(_new_user).name("Q8Join")


QUERIES = {"q0": q0, "q1": q1, "q2": q2, "q3": q3, "q4": q4, "q5": q5, "q7": q7, "q8": q8}

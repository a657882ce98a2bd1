"""A Nexmark-shaped event generator and queries q0, q1, q2, q5.

Nexmark models an online auction: people register, open auctions and bid.
Event ``n`` of the global sequence is, by ``n mod 50``, a person (1 in 50),
an auction (3) or a bid (46) — the benchmark's proportions; ids start at 1000
and a bid goes to one of the ``auctions_in_flight`` newest auctions (a
``hot_ratio`` share to the newest, the hot one). Event ``n`` happens at
``n * 1000 / events_per_second`` ms, then is delayed by up to
``max_out_of_orderness_ms`` (the event-time skew). All columns are numeric and
made on the device in whole batches, so a query's throughput is the engine's,
not Python's. Not bit-compatible with the Java generator (no strings: names,
channels and URLs are omitted); the query semantics are Nexmark's.

* q0 — pass-through of bids (the framework's overhead).
* q1 — currency conversion: ``price * 0.908`` (dollars to euros).
* q2 — selection: bids on auctions with ``auction % 123 == 0``.
* q5 — hot items: per sliding window (10 s every 2 s), the auctions with the
  most bids.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from opforge.stream.functions import Aggregations, ProcessWindowFunction, vectorized
from opforge.stream.records import Batch, RecordSchema
from opforge.stream.sources import Source
from opforge.stream.time import WatermarkStrategy
from opforge.stream.windows import SlidingEventTimeWindows, TumblingEventTimeWindows

PROPORTION = 50
PERSON, AUCTION = 1, 3  # offsets < 1: person, < 4: auction, else bid
FIRST_ID = 1000
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

        def gen(lo, hi):
            for s in range(lo, hi, batch_size):
                yield generate(self.config, self.kind, s, min(s + batch_size, hi), device)

        return [gen(bounds[i], bounds[i + 1]) for i in range(parallelism)]


def bids(env, config: NexmarkConfig):
    return env.from_source(NexmarkSource(config, "bid"), config.watermark_strategy(), "Nexmark bids")


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


def q0(env, config: NexmarkConfig):
    return bids(env, config).map(_identity)


def q1(env, config: NexmarkConfig):
    return bids(env, config).map(_to_euros)


def q2(env, config: NexmarkConfig):
    return bids(env, config).filter(_auction_mod_123).map(_auction_price)


class _HottestAuctions(ProcessWindowFunction):
    def process(self, key, context, elements):
        top = max(e["num"] for e in elements)
        for e in sorted(elements, key=lambda e: e["key"]):
            if e["num"] == top:
                yield {"auction": e["key"], "num": top, "window_start": e["window_start"],
                       "window_end": e["window_end"]}


def q5(env, config: NexmarkConfig, size_ms: int = 10_000, slide_ms: int = 2_000):
    """Bid counts per auction and sliding window (the columnar path), then, per
    window (all its counts carry the time ``end - 1``), the auctions with the most."""
    counts = bids(env, config).key_by("auction").window(SlidingEventTimeWindows.of(size_ms, slide_ms)) \
        .aggregate(Aggregations(with_window=True, num=("count",)))
    return counts.key_by("window_end").window(TumblingEventTimeWindows.of(slide_ms)).process(_HottestAuctions())

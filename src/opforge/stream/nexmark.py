"""A Nexmark-shaped event generator and queries q0, q1, q2, q3, q4, q5, q7, q8.

Nexmark models an online auction: people register, open auctions and bid.
Event ``n`` of the global sequence is, by ``n mod 50``, a person (1 in 50),
an auction (3) or a bid (46) — the benchmark's proportions; ids start at 1000
and a bid goes to one of the ``auctions_in_flight`` newest auctions (a
``hot_ratio`` share to the newest, the hot one). Event ``n`` is produced at
``n * 1000 / events_per_second + max_out_of_orderness_ms`` ms (the offset keeps
every timestamp at 0 or later) and stamped up to ``max_out_of_orderness_ms``
earlier (the event-time skew). All columns are numeric and
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
  its second side arrives (``columnar_join.RegularJoin``).
* q4 — average winning price per category: an auction's winning bid is its
  highest bid with ``auction.date_time <= bid.date_time <= auction.expires``,
  known when the watermark passes ``expires`` (the auction closes); each
  closed auction updates its category's running average. The last update per
  category is the SQL query's answer. Both steps are columnar operators
  (``WinningBidsOperator``, ``RunningAverageOperator``) with record-at-a-time
  forms (``_WinningBids``, ``_AveragePrice``) that give the same updates in
  the same order.
* q5 — hot items: per sliding window (10 s every 2 s), the auctions with the
  most bids.
* q7 — highest bid: per tumbling window (10 s), the bids with the highest price
  (all of them on a tie).
* q8 — monitor new users: people who registered and opened an auction in the
  same tumbling window (10 s), once per person and window: a (columnar)
  window join of persons with the distinct sellers of the window.

Every query takes ``source(env, config, kind) -> DataStream`` (default:
``stream``, events made on the device), so tests and benchmarks can feed the
same events from elsewhere (host memory, Arrow, a permuted list).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from opforge.ops.hashing import segment_reduce_dense as segment_reduce
from opforge.ops.nexmark import FIELDS, OFFSETS, PROPORTION, nexmark_events
from opforge.stream.columnar_join import ColumnarForm, RegularJoin, Rows, SortedRows
from opforge.stream.functions import (Aggregations, KeyedCoProcessFunction, KeyedProcessFunction,
                                      ProcessWindowFunction, vectorized)
from opforge.stream.operators import Operator
from opforge.stream.records import Batch, RecordSchema
from opforge.stream.state import ListStateDescriptor, ValueStateDescriptor
from opforge.stream.sources import RangeSplit, Source
from opforge.stream.state_budget import ColdRows, batch_keys, clear_tiers
from opforge.stream.time import MIN_WATERMARK, WatermarkStrategy
from opforge.stream.windows import SlidingEventTimeWindows, TumblingEventTimeWindows

STATES = ("AL", "AK", "AZ", "AR", "CA", "CO", "CT", "DE", "FL", "GA", "HI", "ID", "IL", "IN", "IA", "KS", "KY",
          "LA", "ME", "MD", "MA", "MI", "MN", "MS", "MO", "MT", "NE", "NV", "NH", "NJ", "NM", "NY", "NC", "ND",
          "OH", "OK", "OR", "PA", "RI", "SC", "SD", "TN", "TX", "UT", "VT", "VA", "WA", "WV", "WI", "WY")


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


def _count_below(n: int, lo: int, hi: int) -> int:
    """Events ``m < n`` with ``lo <= m % PROPORTION < hi`` (host arithmetic)."""
    return (n // PROPORTION) * (hi - lo) + min(max(n % PROPORTION - lo, 0), hi - lo)


def generate(config: NexmarkConfig, kind: str, first: int, last: int, device) -> Batch:
    """The ``kind`` events among global events ``[first, last)``, in order: the
    kind's own indices are a range (no boolean mask over all events, hence no
    device-to-host sync), and ``opforge.nexmark_events`` makes every column
    from them (one Triton pass on a GPU)."""
    if kind not in FIELDS:
        raise ValueError(f"nexmark: kind must be one of {list(FIELDS)}, got {kind!r}")
    lo, hi = OFFSETS[kind]
    j = torch.arange(_count_below(first, lo, hi), _count_below(last, lo, hi), dtype=torch.int64, device=device)
    out = nexmark_events(j, kind, config.seed, config.events_per_second, config.max_out_of_orderness_ms,
                         config.auctions_in_flight, int(config.hot_ratio * 1000))
    return Batch(dict(zip(FIELDS[kind], out)), out[-1], RecordSchema("dict", FIELDS[kind]))


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


def _top_rows(group: torch.Tensor, value: torch.Tensor, bounds: tuple | None = None) -> torch.Tensor:
    """Rows whose ``value`` is the highest of their ``group`` in this batch
    (all of them on a tie), in row order. The groups are window numbers or
    bounds, a narrow range within a batch, so a group's offset from the
    batch's lowest is its id: one min/max read back, one ``segment_reduce``
    max (a batch's windows come in long runs of rows, which it folds in
    registers: one atomic per block, not one per row on a few addresses), one
    compaction, no sort, and the batch may be in any order (bids arrive out of
    order across window bounds). Groups spread wider than the batch has rows
    are numbered by ``torch.unique``. ``bounds``: ``group``'s (min, max) when
    the caller read them back already (with its own checks, one sync)."""
    if group.numel() == 0:
        return torch.zeros(0, dtype=torch.int64, device=group.device)
    lo, hi = torch.stack([group.min(), group.max()]).tolist() if bounds is None else bounds
    slot = group - lo
    span = hi - lo + 1
    if span > group.numel():
        _, slot = torch.unique(group, return_inverse=True)
        span = int(slot.max()) + 1
    top = segment_reduce(value, slot, span, "max")
    return torch.nonzero(value == top[slot]).flatten()


@vectorized
def _window_top_counts(batch):
    """Per window (``window_end``), this batch's counts at the batch's top:
    a window's top counts overall are among them (a count at the window's
    maximum is also at its batch's maximum), so the record-at-a-time window
    after it sees a handful of rows instead of one per (auction, window)."""
    rows = _top_rows(batch["window_end"], batch["num"])
    out = {name: col.index_select(0, rows) for name, col in batch.columns.items()}
    out["__row__"] = rows
    return out


def q5(env, config: NexmarkConfig, size_ms: int = 10_000, slide_ms: int = 2_000, source=stream):
    """Bid counts per auction and sliding window (the columnar pane path: each
    bid is counted once, in its slide-long pane; a window sums its panes), then, per
    window (all its counts carry the time ``end - 1``), the auctions with the most
    (a per-batch pre-filter on the device keeps only each batch's top counts)."""
    counts = bids(env, config, source).key_by("auction").window(SlidingEventTimeWindows.of(size_ms, slide_ms)) \
        .aggregate(Aggregations(with_window=True, num=("count",)))
    return counts.flat_map(_window_top_counts).key_by("window_end") \
        .window(TumblingEventTimeWindows.of(slide_ms)).process(_HottestAuctions())


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


@vectorized
def _q3_rows(person, auction):
    """A (person, auction) pair's output row, for a batch of pairs."""
    return {"person": person["id"], "city": person["city"], "state": person["state"], "auction": auction["id"]}


def q3(env, config: NexmarkConfig, source=stream):
    """``SELECT P.id, P.city, P.state, A.id FROM auction A JOIN person P ON A.seller = P.id
    WHERE A.category = 10 AND P.state IN ('OR', 'ID', 'CA')`` (name omitted): a regular
    join (``columnar_join.RegularJoin``), each pair emitted when its later side arrives
    (person ids are unique: one person per auction)."""
    persons = source(env, config, "person").filter(_q3_person)
    auctions = source(env, config, "auction").filter(_q3_auction)
    return persons.connect(auctions).key_by("id", "seller").process(RegularJoin(_q3_rows)).name("Q3Join")


# -- q4: average price per category ----------------------------------------------

class _WinningBids(ColumnarForm, KeyedCoProcessFunction):
    """Per auction id: the highest valid bid (``auction.date_time <= bid.date_time
    <= auction.expires``), emitted when the watermark passes ``expires`` (the
    auction closes). Bids that come before their auction wait in list state; a
    waiting bid is dropped once the watermark passes its time (its auction,
    which is not later than the bid, could then only be late). The record
    form; the engine runs ``WinningBidsOperator``."""

    def make_operator(self, name, key_selector):
        return WinningBidsOperator(name, key_selector)

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


class _AveragePrice(ColumnarForm, KeyedProcessFunction):
    """A category's running average of winning prices. The record form; the
    engine runs ``RunningAverageOperator``."""

    def make_operator(self, name, key_selector):
        return RunningAverageOperator(name)

    def open(self, ctx):
        self.total = ctx.get_state(ValueStateDescriptor("sum-count"))

    def process_element(self, winner, ctx):
        total, count = self.total.value() or (0, 0)
        total, count = total + winner["price"], count + 1
        self.total.update((total, count))
        yield {"category": winner["category"], "avg": total / count, "auctions": count}


NO_BID = torch.iinfo(torch.int64).min  # an open auction's best price before a valid bid
_SEQ_MAX = 2**63 - 1


class WinningBidsOperator(Operator):
    """``_WinningBids`` on whole batches, with the same outputs in the same
    order. The open auctions are rows sorted by id (``SortedRows``: category,
    date_time, expires and ``best``, the highest valid price so far); a bid
    batch finds its auctions with ``searchsorted`` and folds valid prices in
    with one scatter-max. Bids whose auction is not open wait as rows until
    their auction comes (folded in, then dropped) or the watermark passes
    their time. A watermark closes the auctions with ``expires <= watermark``
    in the record path's timer order: by ``expires``, then by when the timer
    was registered (``seq``: the auction's arrival, or an earlier waiting
    bid's cleanup timer at ``date_time + 1 == expires``, which is the same
    timer). Auction ids are unique (Nexmark's are).

    **State budget** (``env.set_state_budget``; ``state_budget.py``). Open
    auctions and waiting bids together stay within ``device_bytes`` per
    subtask; the others wait in host memory, then Arrow files (``ColdRows``,
    one per table, sharing the host budget; zone maps of id and ``expires`` /
    ``date_time``). An auction's row is needed when a bid for it arrives and
    when the watermark passes its ``expires``; a waiting bid when its auction
    arrives, and it is dropped when the watermark passes its time. The
    coldest rows are those of the keys met longest ago (a row is met when it
    arrives and, for an auction, when a batch bids on it), then, among equally
    recent ones, the latest due (``expires``; a waiting bid's ``date_time + 1``).
    Not simply the latest ``expires``: the auctions that draw bids are the
    newest (Nexmark bids on the ``auctions_in_flight`` newest, the hot one
    most), which are also those expiring latest, so evicting by expiry alone
    would send the hot auction to the host after every batch and fetch it back
    with the next; an auction no longer bid on is needed only at its expiry,
    and the watermark fetches it then through the zone map. So:

    * a bid batch first brings back its auctions (files whose id range holds
      one of the batch's ids, then an exact id match), an auction batch its
      waiting bids the same way;
    * a watermark brings back the cold auctions with ``expires <= watermark``
      (files with ``min(expires) <= watermark`` only) before it closes them,
      and forgets the cold waiting bids whose cleanup timer fired (whole files
      when all their bids are stale, without reading them).

    Results — records, order, times — are those without a budget (the firing
    order depends on ``expires`` and ``seq``, which travel with the rows).
    Host syncs stay per batch: one read-back of the batch's distinct keys
    when rows are cold, a few for an eviction. Checkpoints gather every tier
    (auctions by id, waiting bids by arrival: the order without a budget); a
    restore brings every row back and applies the budget again."""

    def __init__(self, name, key_selector):
        super().__init__(name)
        self.key_selector = key_selector

    def open(self):
        budget = getattr(self, "state_budget", None)
        self.cold = None  # [auctions, waiting bids]: their host and disk tiers (under a state budget)
        if budget is not None:
            self.cold = [ColdRows(budget, f"{self.name}-{self.index}-auctions", zone=("key", "col.expires")),
                         ColdRows(budget, f"{self.name}-{self.index}-early-bids", zone=("key", "col.date_time"))]
            self.cold[0].share_host_budget(self.cold[1])
        self.auctions = SortedRows(self.device, touched=self.cold is not None)
        self.early = Rows.empty(self.device)  # bids before their auction: price, date_time
        self.early_touch = torch.empty(0, dtype=torch.int64, device=self.device)  # under a budget: arrival batch
        self.next_seq = 0
        self._batch_no = 0

    def process_input(self, batch, input_index):
        n = len(batch)
        if n == 0:
            return
        seq = torch.arange(self.next_seq, self.next_seq + n, dtype=torch.int64, device=self.device)
        self.next_seq += n
        if self.cold is not None:
            self._batch_no += 1
            self._bring_back_keys(batch.keys, input_index)
        if input_index == 0:
            self._open_auctions(batch, seq)
        else:
            self._bid(batch, seq)
        self._enforce_budget()

    def process_batch(self, batch):
        raise TypeError(f"{self.name}: a two-input operator needs the input index")

    def _set_early(self, rows: Rows, touch: torch.Tensor | None = None) -> None:
        self.early = rows
        if self.cold is not None:
            self.early_touch = touch

    def _keep_early(self, idx: torch.Tensor) -> None:
        """Keep the waiting bids at ``idx`` (in order)."""
        self._set_early(self.early.take(idx), None if self.cold is None else self.early_touch.index_select(0, idx))

    def _open_auctions(self, batch: Batch, seq: torch.Tensor) -> None:
        start, expires = batch["date_time"], batch["expires"]
        best = torch.full((len(batch),), NO_BID, dtype=torch.int64, device=self.device)
        early = self.early
        if len(early):  # the waiting bids of these auctions: folded in, then dropped
            ids, order = torch.sort(batch.keys)
            pos = torch.searchsorted(ids, early.key).clamp_(max=len(batch) - 1)
            hit = ids.index_select(0, pos) == early.key
            row = order.index_select(0, pos)
            t, price = early.columns["date_time"], early.columns["price"]
            end = expires.index_select(0, row)
            valid = hit & (start.index_select(0, row) <= t) & (t <= end)
            best = best.scatter_reduce(0, row, torch.where(valid, price, NO_BID), "amax")
            same_timer = hit & (t + 1 == end)
            seq = seq.scatter_reduce(0, row, torch.where(same_timer, early.seq, _SEQ_MAX), "amin")
            self._keep_early(torch.nonzero(~hit).flatten())
        cols = {"category": batch["category"], "date_time": start, "expires": expires, "best": best}
        self.auctions.insert(Rows(cols, batch.timestamps, batch.keys, seq), self._batch_no)

    def _bid(self, batch: Batch, seq: torch.Tensor) -> None:
        price, t = batch["price"].to(torch.int64), batch["date_time"]
        n_open = len(self.auctions)
        if n_open:
            lo, count = self.auctions.runs(batch.keys)
            row = lo.clamp(max=n_open - 1)
            a = self.auctions.rows.columns
            valid = (count > 0) & (a["date_time"].index_select(0, row) <= t) & (t <= a["expires"].index_select(0, row))
            a["best"] = a["best"].scatter_reduce(0, row, torch.where(valid, price, NO_BID), "amax")
            waiting = torch.nonzero(count == 0).flatten()
            self.auctions.touch_keys(batch.keys, self._batch_no)  # no-op without a budget
        else:
            waiting = torch.arange(len(batch), device=self.device)
        bids = Rows({"price": price, "date_time": t}, batch.timestamps, batch.keys, seq)
        touch = None
        if self.cold is not None:
            fresh = torch.full((waiting.shape[0],), self._batch_no, dtype=torch.int64, device=self.device)
            touch = torch.cat([self.early_touch, fresh])
        self._set_early(Rows.concat([self.early, bids.take(waiting)]), touch)

    def on_watermark(self, watermark):
        self.watermark = watermark
        if self.cold is not None:
            self._bring_back_closing(watermark)
        checks = []
        if len(self.auctions):
            closing = self.auctions.rows.columns["expires"] <= watermark
            checks.append(closing.sum())
        if len(self.early):
            stale = self.early.columns["date_time"] < watermark  # cleanup timers at date_time + 1 fired
            checks.append(stale.sum())
        counts = torch.stack(checks).tolist() if checks else []
        if len(self.auctions) and counts.pop(0):
            closed = self.auctions.rows.take(torch.nonzero(closing).flatten())
            self.auctions.keep(~closing)
            self._emit_winners(closed)
        if len(self.early) and counts.pop(0):
            self._keep_early(torch.nonzero(~stale).flatten())
        self._enforce_budget()
        self.out.emit_watermark(watermark)

    def _emit_winners(self, closed: Rows) -> None:
        by_seq = torch.argsort(closed.seq, stable=True)
        order = by_seq.index_select(0, torch.argsort(closed.columns["expires"].index_select(0, by_seq), stable=True))
        closed = closed.take(order)
        won = closed.take(torch.nonzero(closed.columns["best"] != NO_BID).flatten())
        if len(won):
            cols = {"auction": self.key_selector.decode_many(won.key), "category": won.columns["category"],
                    "price": won.columns["best"]}
            self.out.emit(Batch(cols, won.columns["expires"], RecordSchema("dict", tuple(cols))))

    # -- the state budget (see the class doc) ------------------------------------------
    def _bring_back_keys(self, keys: torch.Tensor, input_index: int) -> None:
        """Before a batch: its auctions (a bid batch) or its auctions' waiting
        bids (an auction batch) back from the cold tiers, by key."""
        cold = self.cold[1 - input_index]  # bids need auctions (cold[0]); auctions need bids (cold[1])
        if len(cold) == 0:
            return
        want, might_hold = batch_keys(keys)
        back = cold.take(lambda r: torch.isin(r["key"], want), might_hold)
        if back is None:
            return
        rows = Rows.from_cold(back, self.device)
        if input_index == 1:
            self.auctions.insert(rows, self._batch_no)
        else:
            fresh = torch.full((len(rows),), self._batch_no, dtype=torch.int64, device=self.device)
            self._set_early(Rows.concat([self.early, rows]), torch.cat([self.early_touch, fresh]))

    def _bring_back_closing(self, wm: int) -> None:
        """The cold auctions the watermark closes back on the device; the cold
        waiting bids whose cleanup timer fired forgotten."""
        auctions, early = self.cold
        if len(auctions):
            back = auctions.take(lambda r: r["col.expires"] <= wm, lambda f: f["smin"] <= wm)
            if back is not None:
                self.auctions.insert(Rows.from_cold(back, self.device), self._batch_no)
        if len(early):
            early.drop(lambda r: r["col.date_time"] < wm, lambda f: f["smax"] < wm, lambda f: f["smin"] < wm)

    def _enforce_budget(self) -> None:
        """Over the budget: keep on the device the rows met most recently (then
        due soonest, then by arrival) that fit, over both tables; the others go cold."""
        if self.cold is None:
            return
        tables = [(self.auctions.rows, self.auctions.touch, "expires", 0),
                  (self.early, self.early_touch, "date_time", 1)]
        sizes = [rows.nbytes() + touch.numel() * 8 for rows, touch, _, _ in tables]
        limit = self.cold[0].budget.device_bytes
        if sum(sizes) <= limit:
            return
        dev = self.device
        full = [t for t in tables if len(t[0])]
        weight = torch.cat([torch.full((len(rows),), size // len(rows), dtype=torch.int64, device=dev)
                            for (rows, _, _, _), size in zip(tables, sizes) if len(rows)])
        touch = torch.cat([t for _, t, _, _ in full])
        due = torch.cat([rows.columns[c] + extra for rows, _, c, extra in full])
        order = torch.argsort(torch.cat([rows.seq for rows, _, _, _ in full]))
        order = order.index_select(0, torch.argsort(due.index_select(0, order), stable=True))
        order = order.index_select(0, torch.argsort(touch.index_select(0, order), descending=True, stable=True))
        keep = torch.empty(order.shape[0], dtype=torch.bool, device=dev)
        keep[order] = torch.cumsum(weight.index_select(0, order), 0) <= limit
        n_a = len(self.auctions)
        kept_a, kept_e = keep[:n_a], keep[n_a:]
        if n_a:
            gone = torch.nonzero(~kept_a).flatten()
            if gone.numel():
                self.cold[0].add(self.auctions.rows.take(gone).cold())
                self.auctions.keep(kept_a)
        if len(self.early):
            gone = torch.nonzero(~kept_e).flatten()
            if gone.numel():
                self.cold[1].add(self.early.take(gone).cold())
                self._keep_early(torch.nonzero(kept_e).flatten())

    def _clear_cold(self) -> None:
        clear_tiers(self.cold)

    def dispose(self) -> None:
        """The job ended (however): spill files and the host tiers go."""
        self._clear_cold()

    # -- checkpoints -------------------------------------------------------------------
    def snapshot_state(self) -> dict:
        auctions, early = self.auctions.rows, self.early
        if self.cold is not None:  # every tier, in the order without a budget
            cold = [c.take_all() if len(c) else None for c in self.cold]
            if cold[0] is not None:
                auctions = Rows.concat([auctions, Rows.from_cold(cold[0], self.device)]).by_key()
            if cold[1] is not None:
                early = Rows.concat([early, Rows.from_cold(cold[1], self.device)])
            early = early.by_arrival()
        return {"auctions": auctions.state(), "early": early.state(), "next_seq": self.next_seq}

    def restore_state(self, s: dict) -> None:
        self._clear_cold()
        self.auctions.set_rows(Rows.from_state(s["auctions"], self.device))
        early = Rows.from_state(s["early"], self.device)
        self._set_early(early, torch.zeros(len(early), dtype=torch.int64, device=self.device))
        self.next_seq = s["next_seq"]
        self._enforce_budget()


class RunningAverageOperator(Operator):
    """``_AveragePrice`` on whole batches: one output per winner, in input
    order. Per category a running (sum, count) of the integer prices: the
    batch's rows sorted by category (stable), prefix sums within each
    category, seeded with the table's totals; the average is ``sum / count``
    in float64, as Python divides two ints below 2^53.

    **State budget** (``env.set_state_budget``): the table (one row per
    category: key, sum, count, and the last batch that updated it) stays
    within ``device_bytes``; the categories updated longest ago go to host
    memory, then Arrow files (``ColdRows``, zone maps of the key). Categories
    are few and every one may be updated by the next batch, so no time says
    which is needed next: recency of update is the guide. A batch first
    brings back the cold rows of its categories (one read-back of its
    distinct categories), so results are those without a budget; checkpoints
    gather every tier (sorted by category, the order without a budget)."""

    def open(self):
        none = torch.empty(0, dtype=torch.int64, device=self.device)
        self.keys, self.total, self.count = none, none, none  # sorted by key
        self.touch = none  # under a budget: per row, the last batch that updated it
        budget = getattr(self, "state_budget", None)
        self.cold = ColdRows(budget, f"{self.name}-{self.index}", zone=("key", "key")) if budget is not None else None
        self._batch_no = 0

    def process_batch(self, batch):
        n = len(batch)
        if n == 0:
            return
        dev = self.device
        groups, inv = torch.unique(batch.keys, return_inverse=True)
        if self.cold is not None:
            self._batch_no += 1
            self._bring_back(groups)
        order = torch.argsort(inv, stable=True)
        g = inv.index_select(0, order)
        size = torch.bincount(inv, minlength=groups.shape[0])
        first = torch.cumsum(size, 0) - size
        price = batch["price"].to(torch.int64).index_select(0, order)
        csum = torch.cumsum(price, 0)
        run_total = csum - (csum - price).index_select(0, first).index_select(0, g)
        run_count = torch.arange(n, device=dev) - first.index_select(0, g) + 1
        base_total, base_count = self._totals_of(groups)
        total = torch.empty(n, dtype=torch.int64, device=dev)
        count = torch.empty(n, dtype=torch.int64, device=dev)
        total[order] = run_total + base_total.index_select(0, g)
        count[order] = run_count + base_count.index_select(0, g)
        cols = {"category": batch["category"], "avg": total.to(torch.float64) / count.to(torch.float64),
                "auctions": count}
        self.out.emit(Batch(cols, batch.timestamps, RecordSchema("dict", tuple(cols))))
        last = order.index_select(0, first + size - 1)  # each category's last row: its new totals
        self._store(groups, total.index_select(0, last), count.index_select(0, last))
        self._enforce_budget()

    def _totals_of(self, groups: torch.Tensor):
        """The table's (sum, count) of each group (0, 0 for a new one)."""
        zero = torch.zeros_like(groups)
        if self.keys.numel() == 0:
            return zero, zero
        pos = torch.searchsorted(self.keys, groups).clamp_(max=self.keys.shape[0] - 1)
        found = self.keys.index_select(0, pos) == groups
        return (torch.where(found, self.total.index_select(0, pos), zero),
                torch.where(found, self.count.index_select(0, pos), zero))

    def _store(self, groups, total, count) -> None:
        keys = torch.cat([self.keys, groups])
        uniq, inv = torch.unique(keys, return_inverse=True)
        newest = torch.full((uniq.shape[0],), -1, dtype=torch.int64, device=self.device) \
            .scatter_reduce(0, inv, torch.arange(keys.shape[0], device=self.device), "amax")
        self.keys = uniq
        self.total = torch.cat([self.total, total]).index_select(0, newest)
        self.count = torch.cat([self.count, count]).index_select(0, newest)
        if self.cold is not None:
            now = torch.full_like(groups, self._batch_no)
            self.touch = torch.cat([self.touch, now]).index_select(0, newest)

    # -- the state budget (see the class doc) ------------------------------------------
    def _table(self) -> dict:
        return {"key": self.keys, "total": self.total, "count": self.count}

    def _set_table(self, rows: dict, touch: torch.Tensor) -> None:
        self.keys, self.total, self.count, self.touch = rows["key"], rows["total"], rows["count"], touch

    def _bring_back(self, groups: torch.Tensor) -> None:
        """The cold rows of the batch's categories back into the table (kept sorted by key)."""
        if len(self.cold) == 0:
            return
        want, might_hold = batch_keys(groups)
        back = self.cold.take(lambda r: torch.isin(r["key"], want), might_hold)
        if back is None:
            return
        table = self._table()
        rows = {n: torch.cat([c, back[n].to(self.device)]) for n, c in table.items()}
        touch = torch.cat([self.touch, torch.full((rows["key"].shape[0] - self.keys.shape[0],), self._batch_no,
                                                  dtype=torch.int64, device=self.device)])
        order = torch.argsort(rows["key"])
        self._set_table({n: c.index_select(0, order) for n, c in rows.items()}, touch.index_select(0, order))

    def _enforce_budget(self) -> None:
        """Over the budget: the categories updated most recently that fit stay; the others go cold."""
        if self.cold is None:
            return
        n = self.keys.shape[0]
        row_bytes = 8 * 4  # key, sum, count, touch
        keep = min(n, self.cold.budget.device_bytes // row_bytes)
        if keep == n:
            return
        order = torch.argsort(self.touch, descending=True, stable=True)
        kept = torch.sort(order[:keep]).values
        gone = torch.sort(order[keep:]).values
        self.cold.add({name: c.index_select(0, gone).cpu() for name, c in self._table().items()})
        self._set_table({name: c.index_select(0, kept) for name, c in self._table().items()},
                        self.touch.index_select(0, kept))

    def dispose(self) -> None:
        """The job ended (however): spill files and the host tier go."""
        if self.cold is not None:
            self.cold.clear()

    # -- checkpoints -------------------------------------------------------------------
    def snapshot_state(self) -> dict:
        rows = self._table()
        if self.cold is not None and len(self.cold):  # every tier, sorted by key (the order without a budget)
            cold = self.cold.take_all()
            rows = {n: torch.cat([c, cold[n].to(self.device)]) for n, c in rows.items()}
            order = torch.argsort(rows["key"])
            rows = {n: c.index_select(0, order) for n, c in rows.items()}
        return {"keys": rows["key"], "total": rows["total"], "count": rows["count"]}

    def restore_state(self, s: dict) -> None:
        self.keys, self.total, self.count = (s[n].to(self.device) for n in ("keys", "total", "count"))
        self.touch = torch.zeros_like(self.keys)
        if self.cold is not None:
            self.cold.clear()
        self._enforce_budget()


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
    @vectorized(record_watermarks=True)
    def top_of_batch(batch):
        """Per tumbling window, this batch's bids at the batch's top price: a
        window's top bids overall are among them (a pre-filter on the device,
        one pass over the whole batch). It must not let a late bid hide an
        on-time one, so a bid whose window's end its watermark has reached
        (``batch.watermarks``, record granularity: possibly late downstream)
        competes only with bids of its window that saw the same watermark (so
        the same lateness); one before that end is on time downstream at any
        allowed lateness (the window sees no later watermark than it saw here)."""
        ts, price = batch.timestamps, batch["price"]
        group = torch.div(ts, size_ms, rounding_mode="floor")
        bounds = None
        if batch.watermarks is not None and len(batch):
            past_end = batch.watermarks >= (group + 1) * size_ms - 1
            lo, hi, n_past = torch.stack([group.min(), group.max(), past_end.sum()]).tolist()  # one sync
            bounds = (lo, hi)
            if n_past:  # rare: bids behind the watermark
                wm = torch.where(past_end, batch.watermarks, torch.full_like(group, MIN_WATERMARK))
                group = torch.unique(torch.stack([group, wm], 1), dim=0, return_inverse=True)[1]
                bounds = None
        rows = _top_rows(group, price, bounds)
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

@vectorized
def _new_user(person, seller):
    """A batch of (person, seller of the same window) pairs: the new users."""
    return {"id": person["id"], "window_start": seller["window_start"], "window_end": seller["window_end"]}


def q8(env, config: NexmarkConfig, size_ms: int = 10_000, source=stream):
    """``SELECT P.id, P.starttime FROM (persons per tumbling window) P JOIN (distinct
    sellers per tumbling window) A ON P.id = A.seller AND P.starttime = A.starttime``
    (name omitted). The distinct sellers of a window come from the columnar window
    aggregation (its results carry the window's time ``end - 1``), then a columnar
    window join with the persons (``columnar_join.WindowJoinOperator``)."""
    window = TumblingEventTimeWindows.of(size_ms)
    sellers = source(env, config, "auction").key_by("seller").window(window) \
        .aggregate(Aggregations(with_window=True, auctions=("count",)))
    return source(env, config, "person").join(sellers).where("id").equal_to("key").window(window) \
        .apply(_new_user).name("Q8Join")


QUERIES = {"q0": q0, "q1": q1, "q2": q2, "q3": q3, "q4": q4, "q5": q5, "q7": q7, "q8": q8}

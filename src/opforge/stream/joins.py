"""Stream joins with Flink's API, built on connected keyed streams (the
two-input co-process operator), keyed state and event-time timers.

* Window join and co-group (Flink's ``JoinedStreams`` / ``CoGroupedStreams``):
  ``a.join(b).where(key_a).equal_to(key_b).window(assigner).apply(fn)``.
  Both inputs are connected and keyed by their join key. A record goes into
  the buffers of its windows, unless a window is already late
  (``max_timestamp <= watermark``: dropped, as Flink's window operator drops
  it); an event-time timer at the window's ``max_timestamp`` hands both
  buffers to the function and clears them. Outputs carry ``max_timestamp``.
  A join is the inner co-group: ``fn(first, second)`` for every pair, each
  first-input record (arrival order) with every second-input record. A join
  function marked ``@vectorized`` runs columnar instead
  (``opforge.stream.columnar_join.WindowJoinOperator``): ``fn(first,
  second)`` gets two aligned ``Batch`` es of pairs (row ``i`` of each is one
  pair) and returns their outputs, once per batch of fired windows. A
  ``@vectorized`` co-group function runs columnar too
  (``opforge.stream.columnar_cogroup``: ``fn(first, second, groups)``, both
  inputs' rows of a batch of fired (key, window) groups with segment offsets).
* Interval join (``IntervalJoin``): ``a.key_by(k).interval_join(b.key_by(k))
  .between(lower, upper).process(ProcessJoinFunction)`` pairs records of equal
  keys with ``a.ts + lower <= b.ts <= a.ts + upper`` (bounds inclusive unless
  ``lower_bound_exclusive()`` / ``upper_bound_exclusive()``); a pair's time is
  the later of the two. Flink's ``IntervalJoinOperator``: each side buffers
  its records by timestamp, a record probes the other side's buffer, a record
  behind the watermark is late (dropped, or sent to a side output), and a
  timer drops a buffered record once the watermark says no record of the
  other side can still match it. A ``@vectorized`` process-join function
  runs columnar (``opforge.stream.columnar_interval_join``: ``fn(left,
  right)`` on aligned batches of pairs).

Unmarked functions pair one record at a time over host-memory keyed state,
so results are exact and the record-at-a-time reference executor runs the
same functions (the joins are ordinary ``KeyedCoProcessFunction`` s); with a
vectorized join function the reference runs that record form too, calling
the function on the batch of one key and window's pairs.
"""

from __future__ import annotations

import inspect

from opforge.stream.columnar_cogroup import WindowCoGroupOperator, co_group_records
from opforge.stream.columnar_interval_join import IntervalJoinOperator, interval_pairs
from opforge.stream.columnar_join import ColumnarForm, WindowJoinOperator, join_records
from opforge.stream.functions import (CoGroupFunction, FlatJoinFunction, KeyedCoProcessFunction,
                                      TimestampedValue, as_callable, is_vectorized)
from opforge.stream.graph import OutputTag
from opforge.stream.records import Batch
from opforge.stream.state import MapStateDescriptor
from opforge.stream.time import _millis
from opforge.stream.windows import SlidingEventTimeWindows, WindowAssigner


def _open(fn, ctx) -> None:
    if not inspect.isroutine(fn) and callable(getattr(fn, "open", None)):
        fn.open(ctx)


def _timestamp(ctx, where: str) -> int:
    ts = ctx.timestamp()
    if ts is None:
        raise ValueError(f"{where}: a record has no timestamp; joins run in event time (give the sources a "
                         "WatermarkStrategy with a timestamp assigner)")
    return ts


# -- window join / co-group ------------------------------------------------------

class WindowCoGroupFunction(ColumnarForm, KeyedCoProcessFunction):
    """The keyed two-input function behind window joins and co-groups. State:
    ``{(window start, end): ([first records], [second records])}`` per key.
    A join whose function is ``@vectorized`` runs as a ``WindowJoinOperator``."""

    def __init__(self, assigner: WindowAssigner, function, kind: str):
        self.assigner, self.function, self.kind = assigner, function, kind
        self.flat = kind == "flat_join" or isinstance(function, FlatJoinFunction)

    def make_operator(self, name, key_selector):
        if self.kind == "co_group":
            if not is_vectorized(as_callable(self.function, "co_group", name)):
                return None
            return WindowCoGroupOperator(name, self.assigner, self.function, key_selector)
        if not is_vectorized(as_callable(self.function, "join", name)):
            return None
        return WindowJoinOperator(name, self.assigner, self.function, key_selector, self.flat)

    def open(self, ctx):
        self.where = ctx.task_name
        self.call = as_callable(self.function, "co_group" if self.kind == "co_group" else "join", self.where)
        self.panes = ctx.get_map_state(MapStateDescriptor("window-join-panes"))
        _open(self.function, ctx)

    def _add(self, side: int, value, ctx):
        ts = _timestamp(ctx, self.where)
        timers = ctx.timer_service()
        wm = timers.current_watermark()
        for w in self.assigner.assign_one(ts):
            end_ts = w.max_timestamp()
            if end_ts <= wm:
                continue  # the window has fired: late for it
            slot = (w.start, w.end)
            pane = self.panes.get(slot)
            if pane is None:
                pane = ([], [])
                timers.register_event_time_timer(end_ts)
            pane[side].append(value)
            self.panes.put(slot, pane)
        return ()

    def process_element1(self, value, ctx):
        return self._add(0, value, ctx)

    def process_element2(self, value, ctx):
        return self._add(1, value, ctx)

    def on_timer(self, timestamp, ctx):
        for slot, (first, second) in self.panes.items():
            if slot[1] - 1 != timestamp:
                continue
            self.panes.remove(slot)
            if self.kind == "co_group" and is_vectorized(self.call):
                yield from co_group_records(self.call, first, second, timestamp, self.where)
            elif self.kind == "co_group":
                yield from self.call(first, second) or ()
            elif first and second and is_vectorized(self.call):
                firsts = [a for a in first for _ in second]
                seconds = [b for _ in first for b in second]
                yield from join_records(self.call, firsts, seconds, timestamp, self.flat, self.where)
            elif first and second:
                for a in first:
                    for b in second:
                        if self.flat:
                            yield from self.call(a, b) or ()
                        else:
                            yield self.call(a, b)


def _check_assigner(assigner, where: str) -> WindowAssigner:
    if not isinstance(assigner, WindowAssigner):
        raise TypeError(f"{where}: expected a WindowAssigner, got {type(assigner).__name__}")
    if not isinstance(assigner, SlidingEventTimeWindows) or not assigner.event_time:
        raise ValueError(f"{where}: joins take event-time tumbling or sliding windows "
                         f"(TumblingEventTimeWindows / SlidingEventTimeWindows), got {type(assigner).__name__}")
    return assigner


class _Grouped:
    """``a.join(b)`` / ``a.co_group(b)``: ``.where(key_a).equal_to(key_b).window(assigner)``."""

    api = ""

    def __init__(self, first, second, key1=None, key2=None):
        self.first, self.second, self.key1, self.key2 = first, second, key1, key2

    def where(self, key_selector):
        _check_key(key_selector, f"{self.api}.where")
        return type(self)(self.first, self.second, key_selector)

    def equal_to(self, key_selector):
        if self.key1 is None:
            raise ValueError(f"{self.api}.equal_to: call where(key) first")
        _check_key(key_selector, f"{self.api}.equal_to")
        return type(self)(self.first, self.second, self.key1, key_selector)

    def window(self, assigner) -> "WithWindow":
        if self.key2 is None:
            raise ValueError(f"{self.api}.window: give both keys first: .where(key_a).equal_to(key_b)")
        return WithWindow(self, _check_assigner(assigner, f"{self.api}.window"))


def _check_key(key, where):
    if not (isinstance(key, (str, int)) or callable(key)):
        raise TypeError(f"{where}: expected a column name, a position or a callable, got {type(key).__name__}")


class JoinedStreams(_Grouped):
    """Flink's ``JoinedStreams``: an inner join of two streams per key and window."""

    api = "JoinedStreams"


class CoGroupedStreams(_Grouped):
    """Flink's ``CoGroupedStreams``: both inputs' records of a key and window, together."""

    api = "CoGroupedStreams"


class WithWindow:
    def __init__(self, grouped: _Grouped, assigner: WindowAssigner):
        self.grouped, self.assigner = grouped, assigner

    def _build(self, name: str, fn):
        g = self.grouped
        return g.first.connect(g.second).key_by(g.key1, g.key2).process(fn).name(name)

    def apply(self, function):
        """Joins: a ``JoinFunction`` / ``FlatJoinFunction`` / callable ``(first, second)``;
        co-groups: a ``CoGroupFunction`` / callable ``(first_list, second_list)``."""
        if isinstance(self.grouped, CoGroupedStreams):
            if not (callable(function) or hasattr(function, "co_group")):
                raise TypeError("CoGroupedStreams.apply: expected a CoGroupFunction or a callable")
            return self._build("WindowCoGroup", WindowCoGroupFunction(self.assigner, function, "co_group"))
        if not (callable(function) or hasattr(function, "join")):
            raise TypeError("JoinedStreams.apply: expected a JoinFunction, a FlatJoinFunction or a callable")
        if isinstance(function, CoGroupFunction):
            raise TypeError("JoinedStreams.apply: got a CoGroupFunction; use a.co_group(b) for it")
        return self._build("WindowJoin", WindowCoGroupFunction(self.assigner, function, "join"))

    def with_flat_join(self, function):
        """A join whose pair function yields any number of outputs."""
        if not isinstance(self.grouped, JoinedStreams):
            raise TypeError("with_flat_join: only for a.join(b)")
        return self._build("WindowJoin", WindowCoGroupFunction(self.assigner, function, "flat_join"))


# -- interval join -------------------------------------------------------------------

class _JoinContext:
    """``ctx`` of ``ProcessJoinFunction.process_element``."""

    def __init__(self):
        self.left_ts = self.right_ts = 0
        self.outer = None

    def get_left_timestamp(self) -> int:
        return self.left_ts

    def get_right_timestamp(self) -> int:
        return self.right_ts

    def get_timestamp(self) -> int:
        return max(self.left_ts, self.right_ts)

    def output(self, tag, value) -> None:
        self.outer.output(tag, value)


class IntervalJoinFunction(ColumnarForm, KeyedCoProcessFunction):
    """Flink's ``IntervalJoinOperator`` as a keyed co-process function; bounds
    are already inclusive (an exclusive bound moved by 1 ms). A ``@vectorized``
    function runs as an ``IntervalJoinOperator`` (``columnar_interval_join``);
    here (the reference executor, ``columnar = False``) it is called once per
    arriving record, on that record's pairs."""

    def __init__(self, lower: int, upper: int, function, left_late=None, right_late=None):
        self.lower, self.upper, self.function = lower, upper, function
        self.late_tags = (left_late, right_late)

    def make_operator(self, name, key_selector):
        if not is_vectorized(as_callable(self.function, "process_element", name)):
            return None
        return IntervalJoinOperator(name, self.lower, self.upper, self.function, key_selector, self.late_tags)

    def open(self, ctx):
        self.where = ctx.task_name
        self.call = as_callable(self.function, "process_element", self.where)
        self.left = ctx.get_map_state(MapStateDescriptor("interval-join-left"))
        self.right = ctx.get_map_state(MapStateDescriptor("interval-join-right"))
        self.jctx = _JoinContext()
        _open(self.function, ctx)

    def _process(self, value, ctx, ours, other, lo, hi, is_left):
        ts = _timestamp(ctx, self.where)
        timers = ctx.timer_service()
        if ts < timers.current_watermark():
            tag = self.late_tags[0 if is_left else 1]
            if tag is not None:
                ctx.output(tag, value)
            return
        bucket = ours.get(ts)
        if bucket is None:
            bucket = []
        bucket.append(value)
        ours.put(ts, bucket)
        if is_vectorized(self.call):
            yield from self._vectorized(value, ts, other, lo, hi, is_left)
        else:
            yield from self._pairs(value, ts, other, lo, hi, is_left, ctx)
        timers.register_event_time_timer(ts + hi if hi > 0 else ts)

    def _vectorized(self, value, ts, other, lo, hi, is_left):
        mine, theirs, times = [], [], []
        for t, entries in other.items():
            if ts + lo <= t <= ts + hi:
                mine += [value] * len(entries)
                theirs += entries
                times += [t] * len(entries)
        if not mine:
            return
        lefts, rights = (mine, theirs) if is_left else (theirs, mine)
        lts, rts = ([ts] * len(mine), times) if is_left else (times, [ts] * len(mine))
        out = interval_pairs(self.call, Batch.from_records(lefts, "cpu", lts, where=self.where),
                             Batch.from_records(rights, "cpu", rts, where=self.where), self.where)
        for rec, when in zip(out.records(), out.timestamps.tolist()):
            yield TimestampedValue(rec, when)

    def _pairs(self, value, ts, other, lo, hi, is_left, ctx):
        jctx = self.jctx
        jctx.outer = ctx
        for t, entries in other.items():
            if t < ts + lo or t > ts + hi:
                continue
            for e in entries:
                if is_left:
                    jctx.left_ts, jctx.right_ts, pair = ts, t, (value, e)
                else:
                    jctx.left_ts, jctx.right_ts, pair = t, ts, (e, value)
                when = max(ts, t)
                for out in self.call(pair[0], pair[1], jctx) or ():
                    yield TimestampedValue(out, when)

    def process_element1(self, value, ctx):
        return self._process(value, ctx, self.left, self.right, self.lower, self.upper, True)

    def process_element2(self, value, ctx):
        return self._process(value, ctx, self.right, self.left, -self.upper, -self.lower, False)

    def on_timer(self, timestamp, ctx):
        # the buckets whose cleanup time is ``timestamp`` (each registered this timer)
        self.left.remove(timestamp - self.upper if self.upper > 0 else timestamp)
        self.right.remove(timestamp + self.lower if self.lower <= 0 else timestamp)
        return ()


class IntervalJoin:
    """``keyed_a.interval_join(keyed_b)``: give ``between(lower, upper)``."""

    def __init__(self, left, right):
        self.left, self.right = left, right

    def between(self, lower, upper) -> "IntervalJoined":
        lo = _signed_millis(lower, "IntervalJoin.between(lower)")
        hi = _signed_millis(upper, "IntervalJoin.between(upper)")
        if lo > hi:
            raise ValueError(f"IntervalJoin.between: the lower bound {lo} must not exceed the upper bound {hi}")
        return IntervalJoined(self.left, self.right, lo, hi)


def _signed_millis(value, where: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value < 0:
        return -_millis(-value, where)
    if hasattr(value, "total_seconds") and value.total_seconds() < 0:
        return -_millis(-value, where)
    return _millis(value, where)


class IntervalJoined:
    def __init__(self, left, right, lower: int, upper: int):
        self.left, self.right = left, right
        self.lower, self.upper = lower, upper
        self.lower_inclusive = self.upper_inclusive = True
        self.left_late = self.right_late = None

    def lower_bound_exclusive(self) -> "IntervalJoined":
        self.lower_inclusive = False
        return self

    def upper_bound_exclusive(self) -> "IntervalJoined":
        self.upper_inclusive = False
        return self

    def side_output_left_late_data(self, tag: OutputTag) -> "IntervalJoined":
        self.left_late = _tag(tag, "side_output_left_late_data")
        return self

    def side_output_right_late_data(self, tag: OutputTag) -> "IntervalJoined":
        self.right_late = _tag(tag, "side_output_right_late_data")
        return self

    def process(self, process_join_function):
        if not (callable(process_join_function) or hasattr(process_join_function, "process_element")):
            raise TypeError("IntervalJoined.process: expected a ProcessJoinFunction "
                            "(process_element(left, right, ctx)) or a callable")
        lo = self.lower if self.lower_inclusive else self.lower + 1
        hi = self.upper if self.upper_inclusive else self.upper - 1
        if lo > hi:
            raise ValueError(f"IntervalJoin: the interval [{self.lower}, {self.upper}] with exclusive bounds is empty")
        fn = IntervalJoinFunction(lo, hi, process_join_function, self.left_late, self.right_late)
        return self.left.connect(self.right).key_by(self.left._key.selector, self.right._key.selector) \
            .process(fn).name("IntervalJoin")


def _tag(tag, where):
    if not isinstance(tag, OutputTag):
        raise TypeError(f"{where}: expected an OutputTag, got {type(tag).__name__}")
    return tag

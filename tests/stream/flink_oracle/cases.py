"""The jobs that opforge and Apache Flink both run, as plain data (standard
library only: ``flink_jobs.py`` reads the same JSON in the Flink venv).

A case is ``{"name", "job", "bound", "idle_ms", "sources", ...}``:

* ``sources``: one list per source; an item is an event ``{"k", "v", "ts"}``
  or a pause ``{"pause": ms}`` (Flink: the source sleeps that long; opforge:
  ``max(1, ms // STEP_MS)`` empty micro-batches under a ``SimulatedClock``).
* ``bound``: ``for_bounded_out_of_orderness(bound)``: the watermark after a
  record is ``max_ts - bound - 1`` (both sides emit it after every record).
* ``job``: ``"window"`` (``window``: tumbling / sliding / session,
  ``lateness``, ``side_output``) or ``"process"`` (``timer_gap``: the
  KeyedProcessFunction below).
* ``late``: whether some records come after the watermark passed them; such
  a case is run by opforge on one subtask (at batch sizes 1 to 1,024: each
  record sees the watermark after the record before it, Flink's positions),
  the others also with parallelism 2 (their answer does not depend on
  watermark positions).

Outputs, on both sides (lists, compared as multisets):
``["win", key, window_start, window_end, count, sum_v, max_v, timestamp]`` per
window firing (late firings included; ``timestamp``: the result record's), ``["late", k, v, ts]`` per record on the late
side output, and for the process job ``["elem", k, ts, watermark_seen, v]``
per record and ``["fire", key, timer_ts, count, sum_v]`` per event-time timer.
"""

from __future__ import annotations

import random

STEP_MS = 100  # opforge's SimulatedClock step per scheduling round


def events(seed: int, n: int, keys: int, bound: int, late: float = 0.0, late_max: int = 0,
           gap_after: int | None = None, gap_ms: int = 0, solos: int = 2):
    """``n`` events over ``keys`` keys, timestamps rising by 0..19 ms and moved
    back by up to ``bound`` ms (out of order within the bound: never late);
    a ``late`` share moved back by ``bound + 1 .. late_max`` ms instead.
    After event ``gap_after`` time jumps by ``gap_ms`` (windows with no event);
    ``solos`` keys get exactly one event each."""
    rng = random.Random(seed)
    t, out = 1000, []
    for i in range(n):
        t += rng.randint(0, 19)
        if gap_after is not None and i == gap_after:
            t += gap_ms
        jitter = rng.randint(0, bound)
        if late and rng.random() < late:
            jitter = rng.randint(bound + 1, late_max)
        out.append({"k": f"k{rng.randrange(keys)}", "v": rng.randint(-50, 100), "ts": max(0, t - jitter)})
    for j in range(solos):
        pos = rng.randrange(len(out) + 1)
        ts = out[min(pos, len(out) - 1)]["ts"] if out else 0
        out.insert(pos, {"k": f"solo{j}", "v": rng.randint(-50, 100), "ts": ts})
    return out


def _window(name, evs, window, bound, lateness=0, side_output=False, late=False, sources=None, idle_ms=None):
    return {"name": name, "job": "window", "bound": bound, "idle_ms": idle_ms,
            "sources": sources if sources is not None else [evs], "window": window,
            "lateness": lateness, "side_output": side_output, "late": late}


def all_cases() -> list[dict]:
    tumbling = {"kind": "tumbling", "size": 1000}
    in_bound = events(1, 400, 6, 200, gap_after=200, gap_ms=4000)
    cases = [
        # out of order within the bound; empty windows in the 4 s gap; one-event keys
        _window("tumbling_in_bound", in_bound, tumbling, 200),
        _window("sliding_in_bound", events(2, 300, 5, 150, gap_after=150, gap_ms=3000),
                {"kind": "sliding", "size": 1000, "slide": 250}, 150),
        _window("sliding_uneven_slide", events(3, 300, 4, 150),
                {"kind": "sliding", "size": 1000, "slide": 300}, 150),
        _window("session_in_bound", events(4, 250, 5, 100, gap_after=120, gap_ms=2000),
                {"kind": "session", "gap": 120}, 100),
        # late records: dropped, on the side output, and late firings within the allowed lateness
        _window("tumbling_late_dropped", events(5, 300, 4, 100, late=0.12, late_max=1500), tumbling, 100, late=True),
        _window("tumbling_late_side_output", events(6, 300, 4, 100, late=0.12, late_max=1500), tumbling, 100,
                side_output=True, late=True),
        _window("tumbling_allowed_lateness", events(7, 300, 4, 100, late=0.15, late_max=1500), tumbling, 100,
                lateness=400, side_output=True, late=True),
        _window("sliding_allowed_lateness", events(8, 300, 4, 100, late=0.12, late_max=1500),
                {"kind": "sliding", "size": 1000, "slide": 500}, 100, lateness=200, side_output=True, late=True),
        _window("session_allowed_lateness", events(9, 250, 4, 100, late=0.12, late_max=800),
                {"kind": "session", "gap": 150}, 100, lateness=300, side_output=True, late=True),
        # a stream of one event
        _window("one_event", [{"k": "only", "v": 5, "ts": 1234}], tumbling, 100),
    ]
    # empty micro-batches between records (Flink: pauses of 0 ms, i.e. nothing)
    with_empty = []
    for i, e in enumerate(events(10, 200, 3, 100)):
        with_empty.append(e)
        if i % 7 == 0:
            with_empty.append({"pause": 0})
    cases.append(_window("tumbling_empty_batches", None, tumbling, 100, sources=[with_empty]))
    # union with a source that sends no record at all (it ends at once)
    cases.append(_window("union_with_empty_source", None, tumbling, 100,
                         sources=[events(11, 150, 3, 100), [{"pause": 0}]]))
    # union with an idle source: "b" sends one record, then nothing for 15 s;
    # with idleness (300 ms) the busy source's watermark alone drives event time,
    # so its last record (ts 150, after 20 records up to ts 2000) is late.
    # The pauses are far longer than the idle timeout (the answer does not
    # depend on when Flink's idleness check runs), and "a" starts 3 s late so
    # that "b"'s record is in before "a" moves event time. They cost no wall
    # time: the other cases run meanwhile.
    busy = [{"pause": 3000}] + [{"k": "a", "v": i, "ts": i * 100} for i in range(1, 21)] + \
        [{"pause": 3000}, {"k": "a", "v": 99, "ts": 150}]
    quiet = [{"k": "b", "v": 7, "ts": 50}, {"pause": 15000}]
    cases.append(_window("union_idle_source", None, tumbling, 0, side_output=True, late=True,
                         sources=[busy, quiet], idle_ms=300))
    # hand-made edges: records exactly at the watermark, at the end of the
    # allowed lateness (one ms inside, at it), a window first opened by a late
    # record, late firings after the window fired
    b = [("a", 500), ("a", 1100), ("a", 999), ("d", 1299), ("d", 900), ("a", 1300), ("a", 999), ("d", 950),
         ("c", 1000), ("c", 2098), ("c", 1999), ("c", 2099), ("c", 2100), ("c", 1999)]
    cases.append(_window("tumbling_boundaries", [{"k": k, "v": i, "ts": ts} for i, (k, ts) in enumerate(b)],
                         tumbling, 100, lateness=200, side_output=True, late=True))
    # sessions: windows that touch merge (Flink's intersects), one ms apart do not;
    # a record whose own session is late joins a live session and is kept; a
    # session that ends (max timestamp) exactly at the watermark is late, one ms later is not
    s = [("s", 5000), ("s", 5150), ("s", 5301), ("t", 7000), ("t", 7151), ("x", 10000), ("x", 9700), ("x", 9800),
         ("y", 10500), ("y", 10360), ("z", 10800), ("z", 11000), ("z", 10700), ("v", 10750), ("u", 10751),
         ("w", 10000)]
    cases.append(_window("session_boundaries", [{"k": k, "v": i, "ts": ts} for i, (k, ts) in enumerate(s)],
                         {"kind": "session", "gap": 150}, 100, side_output=True, late=True))
    # timers: one ms before the watermark reaches it, exactly at it; a timer
    # registered in the past fires at the next watermark
    p = [("p", 1000), ("q", 1401), ("q", 2000), ("r", 2400), ("r", 2401), ("p", 1000), ("r", 2500), ("p", 1100)]
    cases.append({"name": "process_boundaries", "job": "process", "bound": 100, "idle_ms": None,
                  "sources": [[{"k": k, "v": i, "ts": ts} for i, (k, ts) in enumerate(p)]], "timer_gap": 300,
                  "late": True})
    # KeyedProcessFunction: ValueState + event-time timers (registered, moved, deleted)
    cases.append({"name": "process_timers", "job": "process", "bound": 100, "idle_ms": None,
                  "sources": [events(12, 300, 5, 100, late=0.1, late_max=1200)], "timer_gap": 300, "late": True})
    cases.append({"name": "process_one_event", "job": "process", "bound": 100, "idle_ms": None,
                  "sources": [[{"k": "only", "v": 5, "ts": 1234}]], "timer_gap": 300, "late": True})
    return cases

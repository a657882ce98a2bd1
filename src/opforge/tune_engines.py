"""``opforge tune --preset sql`` / ``--preset stream``: tune what the engines launch.

The SQL engine and the stream engine call ops on shapes that only their own
workloads produce (a join's build side, a window's state as it grows). Since
nothing tunes inside a user's query by default, these presets run the
engines' own workloads once with ``OPFORGE_AUTOTUNE=on`` (or ``exhaustive``)
so every bucket they meet is tuned into the cache: the 22 TPC-H queries on
generated data (``benchmarks/tpch.py``'s workload) and the Nexmark queries
(``benchmarks/stream_nexmark.py``'s, device-generated events).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import Counter
from typing import Callable, NamedTuple

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from opforge.runtime import dispatch
from opforge.runtime.cache import TuneEntry, autotune_cache


class Step(NamedTuple):
    """One unit of an engine's workload: ``run()`` executes it whole."""

    label: str
    run: Callable[[], object]


def sql_steps(sf: float, device: str, numbers=None, root=None, console: Console | None = None) -> list[Step]:
    """The TPC-H queries at scale factor ``sf`` on a connection with every table registered."""
    import opforge.sql as sql
    from opforge.sql.tpch import data, queries, runner

    if console is not None:
        console.print(f"TPC-H SF {sf:g}: generating (once, cached) and registering the tables")
    con = sql.connect(device)
    runner.register_tables(con, data.generate(sf, root))
    return [Step(queries.name(n), lambda n=n: con.sql(queries.query(n)).to_arrow())
            for n in (numbers or queries.NUMBERS)]


def stream_steps(events: int, batch_size: int, device: str, names=None) -> list[Step]:
    """The Nexmark queries on ``events`` events generated on ``device``, as the Nexmark bench runs them."""
    from opforge.stream import StreamExecutionEnvironment
    from opforge.stream.nexmark import QUERIES, NexmarkConfig
    from opforge.stream.sinks import Sink

    class _Count(Sink):
        def __init__(self):
            self.records = 0

        def write(self, batch, subtask):
            self.records += len(batch)

    config = NexmarkConfig(events=events, events_per_second=10_000, max_out_of_orderness_ms=500)

    def job(name: str):
        env = StreamExecutionEnvironment(device=device, batch_size=batch_size)
        sink = _Count()
        QUERIES[name](env, config).sink_to(sink)
        env.execute(f"nexmark {name} (tune)")
        return sink.records

    for name in names or ():
        if name not in QUERIES:
            raise ValueError(f"opforge tune --preset stream: unknown query {name!r}; one of {sorted(QUERIES)}")
    return [Step(name, lambda name=name: job(name)) for name in (names or QUERIES)]


@contextlib.contextmanager
def _mode_set(value: str):
    """Run the block with ``OPFORGE_AUTOTUNE=value`` (``opforge tune`` presets);
    memoized decisions are dropped on the way in and out."""
    old = os.environ.get("OPFORGE_AUTOTUNE")
    os.environ["OPFORGE_AUTOTUNE"] = value
    dispatch.reset()
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("OPFORGE_AUTOTUNE", None)
        else:
            os.environ["OPFORGE_AUTOTUNE"] = old
        dispatch.reset()


class Outcome(NamedTuple):
    entries: list[TuneEntry]  # stored while the workload ran
    failed: dict[str, str]  # step label -> error


def tune_workload(steps: list[Step], mode: str = "on", console: Console | None = None) -> Outcome:
    """Run ``steps`` in autotune ``mode``; every shape bucket they meet is tuned and cached.
    A step that fails is reported and the others still run."""
    if mode not in ("on", "exhaustive"):
        raise ValueError(f"an engine preset tunes in mode 'on' or 'exhaustive', not {mode!r}")
    console = console or Console()
    cache = autotune_cache()
    started = time.time()
    failed: dict[str, str] = {}
    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
    with _mode_set(mode), Progress(*columns, console=console) as progress:
        task = progress.add_task("tuning", total=len(steps))
        for step in steps:
            progress.update(task, description=f"{step.label} (tuned so far: {_count_since(cache, started)})")
            try:
                step.run()
            except Exception as e:  # noqa: BLE001 - reported; the other steps still tune
                failed[step.label] = f"{type(e).__name__}: {e}"[:300]
                progress.console.print(f"[red]{step.label} failed: {failed[step.label]}[/red]")
            progress.advance(task)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    return Outcome([e for e in cache.entries() if e.created >= started], failed)


def _count_since(cache, started: float) -> int:
    return sum(e.created >= started for e in cache.entries())


def summary(outcome: Outcome, title: str) -> Table:
    """Per op and variant: how many shape buckets were tuned, and their buckets (a few)."""
    table = Table(title=title)
    for name in ("op", "variant", "dtype", "buckets tuned", "e.g."):
        table.add_column(name)
    groups: dict[tuple, list[str]] = {}
    for e in outcome.entries:
        groups.setdefault((e.key.op, e.key.variant, e.key.dtype), []).append(e.key.shape_bucket)
    for (op, variant, dtype), buckets in sorted(groups.items()):
        table.add_row(op, variant, dtype, str(len(buckets)), ", ".join(sorted(buckets)[:3]))
    return table


def report(outcome: Outcome, preset: str, console: Console) -> None:
    console.print(summary(outcome, f"opforge tune --preset {preset}"))
    ops = Counter(e.key.op for e in outcome.entries)
    console.print(f"{preset}: {len(outcome.entries)} entries tuned for {len(ops)} ops into {autotune_cache().path}"
                  + (f"; {len(outcome.failed)} steps failed: {', '.join(outcome.failed)}" if outcome.failed else ""),
                  markup=False)

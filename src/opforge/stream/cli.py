"""``opforge stream run FILE.py``: run a DataStream job defined in a Python file.

The file defines ``build(env, args)``. ``env`` is a ``StreamExecutionEnvironment``
made from the flags (``--device``, ``--parallelism``, ``--batch-size``); ``args``
has ``device``, ``events`` (``--events N``, or None: the file's default),
``parallelism``, ``batch_size`` and any ``--set KEY=VALUE`` as ``args.KEY``
(a string). ``build`` adds the job to ``env`` and returns
the ``DataStream`` whose records are the job's result (printed at the end), or
None when the job has sinks of its own. ``JOB_NAME`` in the file names the job
(default: the file's name). For example::

    def build(env, args):
        config = NexmarkConfig(events=args.events or 100_000)
        return q7(env, config)

While the job runs, a progress line shows the events read and their rate, the
watermark lag (the newest event time read minus the job's watermark, in
event-time ms) and backpressure: each source split is read ahead on a
thread into a small queue, and the queued batches are the ones the engine has
not taken yet (a full queue: the engine is the bottleneck; empty: the source).
The engine pushes each polled batch and its watermark through the whole
graph before the next poll, so the sources' minimum watermark is also the
sinks' watermark.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import queue
import threading
import time

from opforge.stream.records import Batch
from opforge.stream.sources import Source, as_batch
from opforge.stream.time import MIN_WATERMARK

QUEUE_DEPTH = 4


def add_parser(sub) -> None:
    s = sub.add_parser("stream", help="DataStream jobs: run a job defined in a Python file")
    cmds = s.add_subparsers(dest="stream_command", required=True)
    r = cmds.add_parser("run", help="run FILE.py's build(env, args) job with a live progress line")
    r.add_argument("file", help="a Python file that defines build(env, args)")
    r.add_argument("--device", help="cuda or cpu (default: cuda when available)")
    r.add_argument("--events", type=int, help="events to generate (passed to build as args.events)")
    r.add_argument("--parallelism", type=int, default=1)
    r.add_argument("--batch-size", type=int, default=65_536)
    r.add_argument("--show", type=int, default=10, help="result records to print (default 10)")
    r.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="an extra setting for build, as args.KEY (a string; repeatable)")


def run(args, console) -> int:
    if args.stream_command == "run":
        extra = {}
        for item in args.set:
            key, eq, value = item.partition("=")
            if not eq or not key.isidentifier():
                console.print(f"[red]opforge stream run: --set expects KEY=VALUE, got {item!r}[/red]")
                return 2
            extra[key] = value
        try:
            summary = run_file(args.file, device=args.device, events=args.events, parallelism=args.parallelism,
                               batch_size=args.batch_size, console=console, show=args.show, extra=extra)
        except (FileNotFoundError, ValueError, TypeError) as e:  # a bad file or job definition
            console.print(f"[red]{type(e).__name__}: {e}[/red]", highlight=False)
            return 2
        return 0 if summary is not None else 1
    return 2


# -- the job file ---------------------------------------------------------------

def load_job(path: str):
    """The module of ``path``; it must define ``build(env, args)``."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"opforge stream run: no such file {path!r}")
    name = "opforge_stream_job_" + os.path.splitext(os.path.basename(path))[0].replace("-", "_")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not callable(getattr(module, "build", None)):
        raise ValueError(f"opforge stream run: {path} defines no build(env, args) "
                         "(it adds the job to env and returns the result DataStream, or None)")
    return module


# -- progress ---------------------------------------------------------------------

class Progress:
    """What the progress line shows; updated by the monitored sources."""

    def __init__(self):
        self.lock = threading.Lock()
        self.started = time.perf_counter()
        self.records = 0
        self.splits: list["_MonitoredSplit"] = []

    def watermark_lag(self):
        """Newest event time read minus the job's watermark (the minimum over
        the splits' watermarks); None until every split has one."""
        with self.lock:
            marks = [s.watermark for s in self.splits]
            if not marks or any(m is None for m in marks):
                return None
            return max(s.max_ts for s in self.splits) - min(marks)

    def queued(self) -> tuple[int, int]:
        """Batches read ahead and not yet taken by the engine, and the room for them."""
        return (sum(s.queue.qsize() for s in self.splits if not s.done), QUEUE_DEPTH * len(self.splits))

    def line(self) -> str:
        elapsed = time.perf_counter() - self.started
        rate = self.records / elapsed if elapsed > 0 else 0.0
        lag = self.watermark_lag()
        queued, depth = self.queued()
        lag_text = "-" if lag is None else f"{lag:,} ms"
        return (f"{self.records:>12,} events  {rate:>12,.0f} events/s  watermark lag {lag_text:>10}  "
                f"backpressure {queued}/{depth} batches queued  {elapsed:6.1f} s")


_END = object()


class _MonitoredSplit:
    """Reads a split ahead on a thread (``QUEUE_DEPTH`` batches) and tracks
    its records, newest event time and watermark."""

    def __init__(self, split, progress: Progress, strategy, device, where):
        self.progress, self.strategy, self.device, self.where = progress, strategy, device, where
        self.queue: queue.Queue = queue.Queue(QUEUE_DEPTH)
        self.max_ts = MIN_WATERMARK
        self.watermark = None
        self.done = False
        self.thread = threading.Thread(target=self._fill, args=(iter(split),), daemon=True)
        self.thread.start()

    def _fill(self, it):
        try:
            for item in it:
                self.queue.put(as_batch(item, self.device, self.where))
        except BaseException as e:  # handed to the engine's thread
            self.queue.put(e)
        self.queue.put(_END)

    def __iter__(self):
        return self

    def __next__(self) -> Batch:
        item = self.queue.get()
        if item is _END:
            self.done = True
            raise StopIteration
        if isinstance(item, BaseException):
            self.done = True
            raise item
        self._observe(item)
        return item

    def _observe(self, batch: Batch) -> None:
        n = len(batch)
        ts = None
        a = self.strategy.timestamp_assigner
        if n and isinstance(a, str) and a in batch.columns:
            ts = int(batch.columns[a].max())
        elif n and a is None:
            ts = int(batch.timestamps.max())
        with self.progress.lock:
            self.progress.records += n
            if ts is not None and ts > self.max_ts:
                self.max_ts = ts
                if self.strategy.out_of_orderness_ms is not None:
                    self.watermark = ts - self.strategy.out_of_orderness_ms - 1


class _MonitoredSource(Source):
    def __init__(self, inner: Source, progress: Progress, strategy, where: str):
        self.inner, self.progress, self.strategy, self.where = inner, progress, strategy, where
        self.max_parallelism = inner.max_parallelism

    def splits(self, parallelism, batch_size, device):
        out = [_MonitoredSplit(s, self.progress, self.strategy, device, self.where)
               for s in self.inner.splits(parallelism, batch_size, device)]
        self.progress.splits.extend(out)
        return out


def monitor_sources(env, progress: Progress) -> None:
    """Wrap every source of ``env``'s job graph so ``progress`` sees its batches."""
    for t in env.transformations:
        if t.kind == "source" and not isinstance(t.params["source"], _MonitoredSource):
            t.params["source"] = _MonitoredSource(t.params["source"], progress,
                                                  t.params["watermark_strategy"], t.name)


# -- running ----------------------------------------------------------------------

def run_file(path: str, device=None, events=None, parallelism: int = 1, batch_size: int = 65_536,
             console=None, show: int = 10, extra: dict | None = None) -> dict | None:
    """Build and run ``path``'s job; print progress, metrics and the first
    ``show`` result records. Returns a summary (events, seconds, events_per_s,
    records, result) or None if the job failed."""
    import torch
    from rich.console import Console
    from rich.live import Live
    from rich.table import Table

    from opforge.stream.datastream import DataStream
    from opforge.stream.environment import StreamExecutionEnvironment

    console = console or Console()
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    module = load_job(path)
    env = StreamExecutionEnvironment(device=device, parallelism=parallelism, batch_size=batch_size)
    args = argparse.Namespace(**(extra or {}), device=device, events=events, parallelism=parallelism,
                              batch_size=batch_size)
    result_stream = module.build(env, args)
    sink = None
    if result_stream is not None:
        if not isinstance(result_stream, DataStream):
            raise TypeError(f"opforge stream run: build() returned {type(result_stream).__name__}; "
                            "expected the result DataStream or None")
        sink = result_stream.collect()
    job_name = getattr(module, "JOB_NAME", os.path.basename(path))
    progress = Progress()
    monitor_sources(env, progress)
    console.print(f"[bold]{job_name}[/bold] on {device}, parallelism {parallelism}, batch size {batch_size:,}")
    try:
        if console.is_terminal:
            with Live(progress.line(), console=console, refresh_per_second=8) as live:
                stop = threading.Event()

                def refresh():
                    while not stop.wait(0.125):
                        live.update(progress.line())

                ticker = threading.Thread(target=refresh, daemon=True)
                ticker.start()
                try:
                    result = env.execute(job_name)
                finally:
                    stop.set()
                    ticker.join()
                    live.update(progress.line())
        else:  # a log, not a terminal: the final line only
            result = env.execute(job_name)
            console.print(progress.line(), markup=False, highlight=False)
    except Exception as e:  # a job error: report it, not a traceback
        console.print(f"[red]{job_name} failed:[/red] {type(e).__name__}: {e}")
        return None
    seconds = result.get_net_runtime() / 1000
    console.print(f"{job_name} finished in {seconds:.2f} s")
    table = Table()
    for col in ("operator", "records in", "records out", "busy ms", "late dropped"):
        table.add_column(col, justify="left" if col == "operator" else "right")
    for name, m in result.metrics.items():
        table.add_row(name, f"{m.records_in:,}", f"{m.records_out:,}", f"{m.busy_ms:,.1f}",
                      f"{m.late_records_dropped:,}")
    console.print(table)
    records = sink.records() if sink is not None else None
    if records is not None:
        console.print(f"result: {len(records):,} records" + (f"; the first {min(show, len(records))}:" if show else ""))
        for r in records[:show]:
            console.print(repr(r), markup=False, highlight=False)
    rate = progress.records / seconds if seconds > 0 else 0.0
    console.print(f"{progress.records:,} events in {seconds:.2f} s on {device}: {rate:,.0f} events/s")
    return {"job": job_name, "events": progress.records, "seconds": seconds, "events_per_s": rate,
            "watermark_lag_ms": progress.watermark_lag(),
            "records": None if records is None else len(records), "result": records, "metrics": result.metrics}

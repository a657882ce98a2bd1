"""A checkpointed job for the fault-injection tests, importable and runnable:

    python checkpoint_job.py DATA_DIR OUT_DIR CHECKPOINT_DIR KILL_AFTER_S
    python checkpoint_job.py --serve     (one run per stdin line, each in a forked child: ``serve``)

Two sources (Parquet files of a directory, and a collection) are unioned and
keyed; a columnar tumbling-window aggregation and a KeyedProcessFunction
(value, list and map state, event-time timers) write through transactional
file sinks (JSON lines and Parquet). With ``KILL_AFTER_S >= 0`` a thread
sends SIGKILL to the process that many seconds after the job starts: a crash
at any point (mid-batch, mid-checkpoint, mid-commit). The job restores from
the latest completed checkpoint in CHECKPOINT_DIR, if there is one.
"""

from __future__ import annotations

import os
import random
import signal
import sys
import threading
import time

import pandas  # noqa: F401,E402  (what the job loads on first use, loaded before the kill timer starts:
import pyarrow.parquet  # noqa: F401,E402  a kill point is a time into the job's work, not into its imports)
import opforge.ops  # noqa: F401,E402
from opforge.stream import (Aggregations, CollectionSource, FileSink, FileSource, KeyedProcessFunction,
                            ListStateDescriptor, MapStateDescriptor, SimulatedClock, StreamExecutionEnvironment,
                            TumblingEventTimeWindows, ValueStateDescriptor, WatermarkStrategy)

BOUND = 30
COLLECTION = 1000


def events(n: int, seed: int, first_ts: int = 0):
    """``(key, value, ts)`` with timestamps rising and jittered within ``BOUND``."""
    rng = random.Random(seed)
    t, out = first_ts, []
    for _ in range(n):
        t += rng.randint(0, 6)
        out.append((rng.randrange(7), rng.randint(-20, 100), max(0, t - rng.randint(0, BOUND))))
    return out


def write_data(data_dir: str, files: int = 4, rows: int = 250) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(data_dir, exist_ok=True)
    for f in range(files):
        ev = events(rows, 100 + f, first_ts=f * rows * 3)  # files follow each other in event time
        pq.write_table(pa.table({"key": [e[0] for e in ev], "value": [e[1] for e in ev], "ts": [e[2] for e in ev]}),
                       os.path.join(data_dir, f"events-{f}.parquet"))


class Summary(KeyedProcessFunction):
    """Per key: count and sum in value state, the last 3 values in list state,
    per-bucket counts in map state; a timer at the end of each 40 ms bucket
    emits the key's summary (event-time timers + keyed state)."""

    def open(self, ctx):
        self.count = ctx.get_state(ValueStateDescriptor("count"))
        self.total = ctx.get_state(ValueStateDescriptor("total"))
        self.last = ctx.get_list_state(ListStateDescriptor("last"))
        self.buckets = ctx.get_map_state(MapStateDescriptor("buckets"))

    def process_element(self, value, ctx):
        self.count.update((self.count.value() or 0) + 1)
        self.total.update((self.total.value() or 0) + value["value"])
        self.last.update((self.last.get() + [value["value"]])[-3:])
        bucket = value["ts"] // 40
        self.buckets.put(bucket, (self.buckets.get(bucket) or 0) + 1)
        ctx.timer_service().register_event_time_timer(bucket * 40 + 39)
        return ()

    def on_timer(self, timestamp, ctx):
        bucket = timestamp // 40
        yield {"key": ctx.get_current_key(), "at": timestamp, "count": self.count.value(),
               "total": self.total.value(), "last": sum(self.last.get()), "in_bucket": self.buckets.get(bucket)}
        self.buckets.remove(bucket)


def build(env, data_dir: str, out_dir: str):
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(BOUND).with_timestamp_assigner("ts")
    files = env.from_source(FileSource(data_dir, "parquet"), strategy, "files")
    coll = env.from_source(CollectionSource([{"key": k, "value": v, "ts": t} for k, v, t in events(COLLECTION, 7)]),
                           strategy, "collection")
    keyed = files.union(coll).key_by("key")
    keyed.window(TumblingEventTimeWindows.of(50)) \
        .aggregate(Aggregations(with_window=True, n=("count",), total=("sum", "value"))) \
        .sink_to(FileSink(os.path.join(out_dir, "windows"), "json"))
    keyed.process(Summary()).name("summary").sink_to(FileSink(os.path.join(out_dir, "summary"), "parquet"))


def run(data_dir: str, out_dir: str, checkpoint_dir: str, restore: bool = True):
    env = StreamExecutionEnvironment(parallelism=2, batch_size=8, clock=SimulatedClock(step_ms=100))
    env.enable_checkpointing(300, checkpoint_dir)
    build(env, data_dir, out_dir)
    return env.execute("checkpointed job", restore_from=checkpoint_dir if restore else None)


def main(argv):
    from opforge.stream.checkpoint import completed_checkpoints

    # kill point: "D" kills D s into the job; "cD" kills D s after its first new checkpoint completes
    # (so a run is sure to leave one to restore from, however slow the machine); negative: no kill
    data_dir, out_dir, checkpoint_dir, kill_spec = argv[1], argv[2], argv[3], argv[4]
    after_checkpoint = kill_spec.startswith("c")
    kill_after = float(kill_spec.lstrip("c"))
    done = completed_checkpoints(checkpoint_dir)
    print(f"start restoring={done[-1][1] if done else None}", flush=True)
    if kill_after >= 0:
        def kill():
            if after_checkpoint:
                while len(completed_checkpoints(checkpoint_dir)) <= len(done):
                    time.sleep(0.005)
            time.sleep(kill_after)
            os.kill(os.getpid(), signal.SIGKILL)

        threading.Thread(target=kill, daemon=True).start()
    res = run(data_dir, out_dir, checkpoint_dir)
    print(f"restored_from={res.restored_from} checkpoints={len(res.checkpoints)}", flush=True)


def _logged_main(argv, stdout, stderr):
    for fd, path in ((1, stdout), (2, stderr)):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
    main(["checkpoint_job.py", *argv])


def serve() -> None:
    """Runs jobs in forked children of this process, so that the imports above
    (seconds of CPU) happen once for all the runs of a fault-injection test,
    not once per run. Each stdin line is a JSON request ``{"argv": [DATA_DIR,
    OUT_DIR, CHECKPOINT_DIR, KILL_SPEC], "stdout": PATH, "stderr": PATH}``;
    the child runs ``main`` writing to those files (a fresh process: nothing
    of an earlier run's memory, as a restart after a crash), and the reply
    line is its exit status as ``subprocess`` reports it (-9: SIGKILLed)."""
    import json

    from forked import fork_call

    for line in sys.stdin:
        pid = fork_call(_logged_main, **json.loads(line))
        _, status = os.waitpid(pid, 0)
        print(json.dumps(os.waitstatus_to_exitcode(status)), flush=True)


if __name__ == "__main__":
    serve() if sys.argv[1:] == ["--serve"] else main(sys.argv)


def per_subtask_rows(path):
    """Each sink subtask's committed rows, in commit order (file boundaries may differ between runs)."""
    from opforge.stream.file_sink import committed_files
    from opforge.stream.file_source import FORMATS, read_table

    out = {}
    for f in committed_files(path):
        subtask = int(os.path.basename(f).split("-")[1])
        out.setdefault(subtask, []).extend(read_table(f, FORMATS["." + f.rsplit(".", 1)[1]]).to_pylist())
    return out

"""A checkpointed JetStream -> opforge -> JetStream job for the NATS tests, and
a fork server that runs it in child processes the tests SIGKILL.

The job reads JSON events ``{"key", "value", "seq"}`` from the subjects
``in.0 .. in.3`` (an event's subject is chosen by its key, as a producer
partitions a Kafka topic, so each key's events keep their order), keeps a
running count and sum per key in value state and writes one record per event
to ``OUT`` through the exactly-once ``NatsSink``.

``python nats_job.py serve``: imports everything once, then for each JSON line
on stdin (the job's arguments) forks a child that runs the job, restoring from
the latest checkpoint, and answers ``{"pid": ...}``; after the next line it
reaps the child and answers ``{"exit": ...}``.
A kill costs a fork, not a fresh interpreter (torch's import is seconds).
"""

from __future__ import annotations

import json
import os
import random
import sys

from forked import fork_call
from opforge.stream import (KeyedProcessFunction, SimulatedClock, StreamExecutionEnvironment,
                            ValueStateDescriptor, WatermarkStrategy)
from opforge.stream.nats_sink import NatsSink
from opforge.stream.nats_source import NatsSource

STREAM, OUT_STREAM = "IN", "OUT"
SUBJECTS = [f"in.{i}" for i in range(4)]


def events(n: int, keys: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    return [{"key": rng.randrange(keys), "value": rng.randint(-50, 100), "seq": i} for i in range(n)]


def subject_of(event: dict) -> str:
    return SUBJECTS[event["key"] % len(SUBJECTS)]


def expected(evs: list[dict]) -> list[dict]:
    """The failure-free output, from plain Python."""
    count, total, out = {}, {}, []
    for e in evs:
        k = e["key"]
        count[k] = count.get(k, 0) + 1
        total[k] = total.get(k, 0) + e["value"]
        out.append({"key": k, "seq": e["seq"], "count": count[k], "total": total[k]})
    return out


class RunningSum(KeyedProcessFunction):
    def open(self, ctx):
        self.count = ctx.get_state(ValueStateDescriptor("count"))
        self.total = ctx.get_state(ValueStateDescriptor("total"))

    def process_element(self, value, ctx):
        c, t = (self.count.value() or 0) + 1, (self.total.value() or 0) + value["value"]
        self.count.update(c)
        self.total.update(t)
        yield {"key": value["key"], "seq": value["seq"], "count": c, "total": t}


def run(url: str, ckpt: str, out_subject: str, parallelism: int, batch: int = 40) -> None:
    env = StreamExecutionEnvironment(parallelism=parallelism, batch_size=batch, clock=SimulatedClock(step_ms=100))
    env.enable_checkpointing(200, ckpt)
    src = NatsSource(url, STREAM, SUBJECTS, format="json")
    env.from_source(src, WatermarkStrategy.no_watermarks(), "jetstream").key_by("key") \
        .process(RunningSum()).name("running sum").sink_to(NatsSink(url, out_subject))
    env.execute("nats job", restore_from=ckpt)


def serve() -> None:
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        args = json.loads(line)
        pid = fork_call(run, **args)
        print(json.dumps({"pid": pid}), flush=True)
        sys.stdin.readline()  # "wait": until then the child stays ours to kill (a zombie at worst)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"exit": os.waitstatus_to_exitcode(status)}), flush=True)


if __name__ == "__main__":
    serve()

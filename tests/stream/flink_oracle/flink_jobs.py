"""Runs the oracle cases on Apache Flink (PyFlink's local mini-cluster).

Run with the Flink venv's python (``make .venv-flink``), never opforge's:
    python flink_jobs.py CASES.json RESULTS.json

All cases are built into ONE Flink job (one mini-cluster start), each case from its own sources so that each has its own event time;
their outputs are JSON strings tagged with the case name, unioned into one
collected stream.

Deterministic watermarks. Flink's ``WatermarkStrategy.for_bounded_out_of_orderness``
emits periodically (every ``pipeline.auto-watermark-interval`` of processing
time), so which records are late would depend on timing. Instead each source
goes through the Table runtime's watermark assigner (``from_data_stream`` with
a ``WATERMARK`` expression ``rt - (bound + 1) ms``, then ``to_data_stream``):
with ``pipeline.auto-watermark-interval: 0`` it emits a watermark right after
every record that advances it (its "eager" rule: emit when the watermark grew
by more than the interval). Every Python operator then sees records and
watermarks in the source's order: in thread mode (below) it is called for each
record as it comes; in process mode it would hold a watermark back until its
current bundle finishes, and ``python.fn-execution.bundle.size: 1`` (kept)
finishes a bundle per record. Parallelism 1 everywhere. Bounded sources end with the MAX
watermark, which fires what is left.

Cost. The Python functions run in PyFlink's "thread" execution mode: an
interpreter embedded in the task manager's JVM (pemja) calls them for each
record in order, where the default "process" mode sends every one-record
bundle over gRPC to a Beam worker. Both modes give the same outputs for every
case (checked when the mode was switched). ``JVM_ARGS`` keeps the JVM's JIT
at C1 and its GC serial: a job of a minute or two does not earn back C2's
compile time. CPU time of the whole job (JVM + Python, measured on the
2-core test machine): process mode 225 s, thread mode 71 s, thread mode with
these JVM flags 45 s; the test suite shares those cores.

Pauses (``{"pause": ms}``) sleep in a Python flat_map that runs in its own
task (``rebalance()`` breaks the chain, so the watermark assigner's idleness
timer keeps running while the flat_map sleeps). Idleness is
``table.exec.source.idle-timeout`` of a second table environment used only
for the cases that set ``idle_ms``.
"""

import json
import os
import site
import sys
import time

from pyflink.common import Configuration, Types
from pyflink.common.time import Time
from pyflink.datastream import OutputTag, StreamExecutionEnvironment
from pyflink.datastream.functions import (FlatMapFunction, KeyedProcessFunction, ProcessFunction,
                                          ProcessWindowFunction)
from pyflink.datastream.state import ValueStateDescriptor
from pyflink.datastream.window import (EventTimeSessionWindows, SlidingEventTimeWindows,
                                       TumblingEventTimeWindows)
from pyflink.table import EnvironmentSettings, Schema, StreamTableEnvironment


class Pauses(FlatMapFunction):
    def flat_map(self, r):
        if r["pause"] >= 0:
            time.sleep(r["pause"] / 1000)
            return
        yield r


class WindowStats(ProcessWindowFunction):
    def __init__(self, case):
        self.case = case

    def process(self, key, context, elements):
        vs = [e["v"] for e in elements]
        w = context.window()
        yield json.dumps([self.case, "win", key, w.start, w.end, len(vs), sum(vs), max(vs)])


class Stamp(ProcessFunction):
    """Appends the record's timestamp (a window result's: the window's max timestamp)."""

    def process_element(self, value, ctx):
        yield json.dumps(json.loads(value) + [ctx.timestamp()])


class Timers(KeyedProcessFunction):
    """Count and sum per key in ValueState; an event-time timer at
    ``ts + gap`` of the latest record (an earlier pending one is deleted);
    the timer reports and clears the state."""

    def __init__(self, case, gap):
        self.case, self.gap = case, gap

    def open(self, runtime_context):
        self.acc = runtime_context.get_state(ValueStateDescriptor("acc", Types.PICKLED_BYTE_ARRAY()))

    def process_element(self, value, ctx):
        service_wm = ctx.timer_service().current_watermark()
        ts = value["ts"]
        yield json.dumps([self.case, "elem", value["k"], ts, service_wm, value["v"]])
        acc = self.acc.value() or [0, 0, None]
        acc[0] += 1
        acc[1] += value["v"]
        t = ts + self.gap
        if acc[2] is None or t > acc[2]:
            if acc[2] is not None:
                ctx.timer_service().delete_event_time_timer(acc[2])
            ctx.timer_service().register_event_time_timer(t)
            acc[2] = t
        self.acc.update(acc)

    def on_timer(self, timestamp, ctx):
        acc = self.acc.value()
        yield json.dumps([self.case, "fire", ctx.get_current_key(), timestamp, acc[0], acc[1]])
        self.acc.clear()


def main(cases_path: str, results_path: str) -> None:
    t0 = time.time()
    # read by the JVM that PyFlink starts: its JIT and GC (see the module docstring), and the
    # embedded interpreter's path to this venv's packages (pemja, pyflink)
    os.environ.setdefault("JVM_ARGS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
    os.environ["PYTHONPATH"] = os.pathsep.join(site.getsitepackages())
    with open(cases_path) as f:
        cases = json.load(f)

    conf = Configuration()
    conf.set_string("pipeline.auto-watermark-interval", "0")
    conf.set_string("python.fn-execution.bundle.size", "1")
    conf.set_string("parallelism.default", "1")
    conf.set_string("python.execution-mode", "thread")
    env = StreamExecutionEnvironment.get_execution_environment(conf)
    env.set_python_executable(sys.executable)
    env.add_python_file(__file__)
    env.set_parallelism(1)
    env.get_config().set_auto_watermark_interval(0)
    settings = EnvironmentSettings.in_streaming_mode()
    t_envs = {}

    def t_env_for(idle_ms):
        if idle_ms not in t_envs:
            t = StreamTableEnvironment.create(env, settings)
            if idle_ms:
                t.get_config().set("table.exec.source.idle-timeout", f"{idle_ms} ms")
            t_envs[idle_ms] = t
        return t_envs[idle_ms]

    in_t = Types.ROW_NAMED(["k", "v", "ts", "pause"], [Types.STRING(), Types.LONG(), Types.LONG(), Types.LONG()])

    def late_tag(name):
        # a fresh type per use: a RowTypeInfo that met the JVM holds a py4j
        # object and can no longer be pickled into a Python function
        return OutputTag(f"late-{name}", Types.ROW_NAMED(
            ["k", "v", "ts", "pause", "rt"], [Types.STRING(), Types.LONG(), Types.LONG(), Types.LONG(),
                                              Types.INSTANT()]))

    def source(items, bound, idle_ms):
        rows = [("", 0, 0, it["pause"]) if "pause" in it else (it["k"], it["v"], it["ts"], -1) for it in items]
        ds = env.from_collection(rows, type_info=in_t)
        if any("pause" in it for it in items):
            ds = ds.flat_map(Pauses(), output_type=in_t).rebalance()
        schema = (Schema.new_builder().column("k", "STRING").column("v", "BIGINT").column("ts", "BIGINT")
                  .column("pause", "BIGINT").column_by_expression("rt", "TO_TIMESTAMP_LTZ(ts, 3)")
                  .watermark("rt", f"rt - INTERVAL '{(bound + 1) / 1000:.3f}' SECOND").build())
        t_env = t_env_for(idle_ms)
        return t_env.to_data_stream(t_env.from_data_stream(ds, schema))

    def assigner(w):
        if w["kind"] == "tumbling":
            return TumblingEventTimeWindows.of(Time.milliseconds(w["size"]))
        if w["kind"] == "sliding":
            return SlidingEventTimeWindows.of(Time.milliseconds(w["size"]), Time.milliseconds(w["slide"]))
        return EventTimeSessionWindows.with_gap(Time.milliseconds(w["gap"]))

    outputs = []
    for case in cases:
        name = case["name"]
        streams = [source(s, case["bound"], case.get("idle_ms")) for s in case["sources"]]
        stream = streams[0].union(*streams[1:]) if len(streams) > 1 else streams[0]
        keyed = stream.key_by(lambda r: r["k"], key_type=Types.STRING())
        if case["job"] == "process":
            outputs.append(keyed.process(Timers(name, case["timer_gap"]), output_type=Types.STRING()))
            continue
        ws = keyed.window(assigner(case["window"]))
        if case["lateness"]:
            ws = ws.allowed_lateness(case["lateness"])
        if case["side_output"]:
            ws = ws.side_output_late_data(late_tag(name))
        result = ws.process(WindowStats(name), output_type=Types.STRING())
        outputs.append(result.process(Stamp(), output_type=Types.STRING()))
        if case["side_output"]:
            outputs.append(result.get_side_output(late_tag(name)).map(
                lambda r, n=name: json.dumps([n, "late", r["k"], r["v"], r["ts"]]), output_type=Types.STRING()))
    t1 = time.time()
    collected = list(outputs[0].union(*outputs[1:]).execute_and_collect("opforge flink oracle"))
    t2 = time.time()
    results = {c["name"]: [] for c in cases}
    for line in collected:
        rec = json.loads(line)
        results[rec[0]].append(rec[1:])
    import pyflink.version
    with open(results_path, "w") as f:
        json.dump({"flink": pyflink.version.__version__, "build_s": round(t1 - t0, 2),
                   "run_s": round(t2 - t1, 2), "results": results}, f)


if __name__ == "__main__":
    # run as the module ``flink_jobs`` (shipped to the Python worker), so that
    # the functions above are pickled by reference, not by value from __main__
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import flink_jobs

    flink_jobs.main(sys.argv[1], sys.argv[2])

"""What each operator puts into a checkpoint, and how it is put back.

Kept beside the operators rather than inside them: one place lists every
operator's durable fields (keyed state with TTL stamps, timers, window
contents, rolling tables, the watermark). An operator class of another
module joins by defining ``snapshot_state() -> dict`` and
``restore_state(dict)``; an operator that is neither known here nor defines
them makes the checkpoint fail with its name, instead of losing its state.
Restore runs after ``open``, so the structures ``open`` made are replaced.
"""

from __future__ import annotations

from opforge.stream.checkpoint import CheckpointSerializationError, schema_from_state, schema_state
from opforge.stream.operators import (FilterOperator, FlatMapOperator, MapOperator, Operator, PassThrough,
                                      ProcessOperator, SinkOperator)
from opforge.stream.rolling import RollingOperator
from opforge.stream.columnar_windows import ColumnarWindows
from opforge.stream.window_operator import WindowOperator

_STATELESS = (MapOperator, FilterOperator, FlatMapOperator, PassThrough)


def snapshot_operator(op: Operator, checkpoint_id: int) -> dict:
    own = getattr(op, "snapshot_state", None)
    if callable(own):
        return {"watermark": op.watermark, "own": own()}
    s = {"watermark": op.watermark}
    if isinstance(op, ProcessOperator):
        s["timer_watermark"] = op.timers.watermark
        s["event_timers"] = op.event_timers.snapshot()
        s["processing_timers"] = op.proc_timers.snapshot()
        if op.key_selector is not None:
            s["keyed_state"] = op.state.snapshot()
        if hasattr(op, "broadcast_state"):  # broadcast_state.BroadcastProcessOperator
            s["broadcast_state"] = op.broadcast_state
    elif isinstance(op, SinkOperator):
        pre = getattr(op.sink, "snapshot_state", None)
        s["sink"] = pre(op.index, checkpoint_id) if callable(pre) else None
    elif isinstance(op, WindowOperator):
        s["window_contents"] = op.contents
        s["trigger_state"] = op.trigger_state
        s["sessions"] = op.sessions
        s["fire_timers"] = op.event_timers.snapshot()  # the trigger's event-time timers
        s["trigger_processing_timers"] = op.proc_timers.snapshot()
        s["cleanup_timers"] = op.cleanup_timers.snapshot()
        s["late_dropped"] = op.late.dropped
    elif isinstance(op, ColumnarWindows):
        s["window_table"] = op.full_table()  # every tier of a table over its state budget
        s["late_dropped"] = op.late.dropped
    elif isinstance(op, RollingOperator):
        schema = op.schema
        slot_of, first, running = op.full_state()  # every tier of a table over its state budget
        s["rolling"] = {"acc": op.acc, "slot_of": slot_of, "first": first, "running": running,
                        "schema": schema_state(schema)}
    elif not isinstance(op, _STATELESS):
        raise CheckpointSerializationError(
            f"checkpoint: operator {op.name!r} ({type(op).__name__}) does not support checkpoints; "
            "define snapshot_state() and restore_state(state) on it")
    return s


def restore_operator(op: Operator, s: dict) -> None:
    op.watermark = s["watermark"]
    if "own" in s:
        op.restore_state(s["own"])
        return
    if isinstance(op, ProcessOperator):
        op.timers.watermark = s["timer_watermark"]
        op.event_timers.restore(s["event_timers"])
        op.proc_timers.restore(s["processing_timers"])
        if op.key_selector is not None:
            op.state.restore(s["keyed_state"])
        if "broadcast_state" in s:
            op.broadcast_state = s["broadcast_state"]
    elif isinstance(op, SinkOperator):
        sink, state = op.sink, s["sink"]
        if isinstance(state, dict) and "rescaled" in state and len(state) == 1:  # rescale.py
            _restore_rescaled_sink(op, state["rescaled"])
            return
        restore = getattr(sink, "restore_state", None)
        if state is not None and callable(restore):
            restore(op.index, state)
    elif isinstance(op, WindowOperator):
        op.contents, op.sessions = s["window_contents"], s["sessions"]
        # a checkpoint from before triggers were classes holds count triggers' counts only
        op.trigger_state = s["trigger_state"] if "trigger_state" in s else \
            {slot: {"count": n} for slot, n in s.get("trigger_counts", {}).items() if n}
        op.event_timers.restore(s["fire_timers"])
        op.proc_timers.restore(s.get("trigger_processing_timers", []))
        op.cleanup_timers.restore(s["cleanup_timers"])
        op.late.dropped = s["late_dropped"]
    elif isinstance(op, ColumnarWindows):
        op.restore_table(s["window_table"])
        op.late.dropped = s["late_dropped"]
    elif isinstance(op, RollingOperator):
        r = s["rolling"]
        op.acc, op.slot_of, op.first, op.running = r["acc"], r["slot_of"], dict(r["first"]), r["running"]
        op.restored()
        if r["schema"] is not None:
            op.schema = schema_from_state(r["schema"])


def _restore_rescaled_sink(op, states: list) -> None:
    """A sink subtask of a rescaled job takes over the states of old subtasks ``j``
    (``[[j, state], ...]``, ``j % parallelism == index``)."""
    if not states:
        return
    restore = getattr(op.sink, "restore_rescaled", None)
    if not callable(restore):
        from opforge.stream.checkpoint import CheckpointRestoreError

        raise CheckpointRestoreError(f"restore_from: sink {op.name!r} ({type(op.sink).__name__}) cannot be restored "
                                     "at another parallelism; keep its parallelism (set_parallelism)")
    restore(op.index, [(j, st) for j, st in states])


def notify_checkpoint_complete(op: Operator, checkpoint_id: int) -> None:
    """Flink's ``notifyCheckpointComplete``: sinks commit what the checkpoint covered."""
    if isinstance(op, SinkOperator):
        commit = getattr(op.sink, "notify_checkpoint_complete", None)
        if callable(commit):
            commit(op.index, checkpoint_id)
    else:
        hook = getattr(op, "notify_checkpoint_complete", None)
        if callable(hook):
            hook(checkpoint_id)

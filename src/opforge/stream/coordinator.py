"""``CheckpointCoordinator``: takes checkpoints and savepoints of a running
job at round boundaries (aligned barriers, see ``checkpoint.py``) and puts a
job back into the state of one.

A snapshot holds, per operator (named by its place in the graph, kind and
name, which a restored job must match), every subtask's input-channel
watermarks and operator state; per source subtask its split position and
watermark generator; the key codecs; and a ``SimulatedClock``'s time (so a
restored simulated job sees the same processing time; a system clock is not
restored). Each keyed subtask's state is that of its key-group range (stored
beside it), so a job may restore at another parallelism (``rescale.py``). A checkpoint completes when its ``_metadata`` is written; then
every operator is notified (sinks commit their pending files).
"""

from __future__ import annotations

import os

from opforge.stream.checkpoint import (CheckpointRestoreError, StateEncoder, completed_checkpoints,
                                       read_checkpoint, retain, sweep_incomplete, write_checkpoint)
from opforge.stream.operator_state import notify_checkpoint_complete, restore_operator, snapshot_operator
from opforge.stream.partitioning import MAX_PARALLELISM
from opforge.stream.rescale import key_group_range, rescale_source, rescale_subtasks
from opforge.stream.time import SimulatedClock


def operator_uid(index: int, t) -> str:
    return f"{index}:{t.kind}:{t.name}"


class CheckpointCoordinator:
    def __init__(self, env, transformations, nodes, job_name: str):
        self.env, self.transformations, self.nodes, self.job_name = env, transformations, nodes, job_name
        self.config = getattr(env, "checkpoint_config", None)
        self.uids = [operator_uid(i, t) for i, t in enumerate(transformations)]
        self.next_id = 1
        self.last_time = env.clock.now()
        self.completed: list[str] = []
        if self.config is not None:
            os.makedirs(self.config.checkpoint_dir, exist_ok=True)
            sweep_incomplete(self.config.checkpoint_dir)
            done = completed_checkpoints(self.config.checkpoint_dir)
            if done:  # ids go on from the newest checkpoint there (also on a fresh start)
                self.next_id = done[-1][0] + 1

    # -- snapshot -------------------------------------------------------------------
    def _key_spaces(self):
        for t in self.transformations:
            for inp in t.inputs:
                if inp.key is not None:
                    yield inp.key.space

    def _encode(self, checkpoint_id: int):
        enc = StateEncoder()
        ops, sources = {}, {}
        for uid, t in zip(self.uids, self.transformations):
            node = self.nodes[t.id]
            if t.kind == "source":
                sources[uid] = [enc.encode(_source_state(r), f"source {t.name!r} (subtask {r.index})")
                                for r in node.runners]
                continue
            subtasks = []
            for r in node.runners:
                where = f"operator {t.name!r} (subtask {r.index})"
                state = {k: ({n: enc.encode(v, f"{where}, state {n!r}") for n, v in s.items()}
                             if k == "keyed_state" else enc.encode(s, f"{where}, {k.replace('_', ' ')}"))
                         for k, s in snapshot_operator(r.op, checkpoint_id).items()}
                subtasks.append({"key_groups": key_group_range(r.index, len(node.runners)),
                                 "channels": enc.encode([[e, u, w, r.idle[(e, u)]] for (e, u), w in r.wms.items()],
                                                        where),
                                 "current": r.current, "out_idle": r.out_idle, "operator": state})
            ops[uid] = subtasks
        spaces = [enc.encode([s.identity, s.codec.values], "the key codec of a key_by") for s in self._key_spaces()]
        clock = self.env.clock
        tree = {"checkpoint_id": checkpoint_id, "max_parallelism": MAX_PARALLELISM, "operators": ops,
                "sources": sources, "key_spaces": spaces,
                "clock": clock.now() if isinstance(clock, SimulatedClock) else None}
        return tree, enc.tensors

    def snapshot_to(self, target: str, kind: str) -> str:
        """Snapshot every subtask, write it atomically, then notify (commit)."""
        cid = self.next_id
        tree, tensors = self._encode(cid)
        self.next_id += 1
        path = write_checkpoint(target, cid, kind, self.job_name, tree, tensors, self.uids)
        for n in self.nodes.values():
            for r in n.runners:
                if hasattr(r, "op"):
                    notify_checkpoint_complete(r.op, cid)
        return path

    def checkpoint(self) -> str:
        cfg = self.config
        path = self.snapshot_to(os.path.join(cfg.checkpoint_dir, f"chk-{self.next_id}"), "checkpoint")
        retain(cfg.checkpoint_dir, cfg.max_retained_checkpoints)
        self.completed.append(path)
        self.last_time = self.env.clock.now()
        return path

    def savepoint(self, directory) -> str:
        directory = os.fspath(directory)
        return self.snapshot_to(os.path.join(directory, f"savepoint-{self.next_id}"), "savepoint")

    def due(self) -> bool:
        return self.config is not None and self.env.clock.now() - self.last_time >= self.config.interval_ms

    # -- restore --------------------------------------------------------------------
    def restore(self, path: str) -> None:
        meta, tree = read_checkpoint(path, self.env.device)
        saved = meta["operators"]
        if saved != self.uids:
            diff = next((f"{a!r} in the checkpoint, {b!r} in the job" for a, b in zip(saved, self.uids) if a != b),
                        f"{len(saved)} operators in the checkpoint, {len(self.uids)} in the job")
            raise CheckpointRestoreError(f"restore_from {path}: the job graph differs from the checkpoint's "
                                         f"({diff})")
        if tree.get("max_parallelism", MAX_PARALLELISM) != MAX_PARALLELISM:
            raise CheckpointRestoreError(f"restore_from {path}: the checkpoint has {tree['max_parallelism']} key "
                                         f"groups, this engine {MAX_PARALLELISM}")
        self.next_id = max(self.next_id, meta["checkpoint_id"] + 1)
        for space, (identity, values) in zip(self._key_spaces(), tree["key_spaces"]):
            space.identity = identity
            space.codec.values = list(values)
            space.codec.ids = {v: i for i, v in enumerate(space.codec.values)}
        if tree["clock"] is not None and isinstance(self.env.clock, SimulatedClock):
            self.env.clock._now = tree["clock"]
        for uid, t in zip(self.uids, self.transformations):
            runners = self.nodes[t.id].runners
            states = tree["sources"][uid] if t.kind == "source" else tree["operators"][uid]
            if len(states) != len(runners):  # rescaling: key groups move between subtasks
                states = rescale_source(t.params["source"], t.name, states, len(runners)) if t.kind == "source" \
                    else rescale_subtasks(t.name, [r.op for r in runners], states, [list(r.wms) for r in runners])
            for r, s in zip(runners, states):
                if t.kind == "source":
                    _restore_source(r, s, self.env.clock)
                    continue
                for e, u, w, idle in s["channels"]:
                    r.wms[(e, u)], r.idle[(e, u)] = w, idle
                r.current, r.out_idle = s["current"], s["out_idle"]
                restore_operator(r.op, s["operator"])
        self.last_time = self.env.clock.now()


def _source_state(r) -> dict:
    return {"position": r.split.position(), "finished": r.finished, "idle": r.idle,
            "last_record_ms": r.last_record_ms, "prev_ts": r.prev_ts,
            "wm_max": r.wmgen.max_ts, "wm_emitted": r.wmgen.emitted}


def _restore_source(r, s: dict, clock) -> None:
    r.finished, r.idle, r.prev_ts = s["finished"], s["idle"], s["prev_ts"]
    # idleness is measured from the restore on a wall clock (the job was down meanwhile)
    r.last_record_ms = s["last_record_ms"] if isinstance(clock, SimulatedClock) else clock.now()
    r.wmgen.max_ts, r.wmgen.emitted = s["wm_max"], s["wm_emitted"]
    if not r.finished:
        r.split.seek(s["position"])

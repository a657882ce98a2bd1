"""``CheckpointCoordinator``: takes checkpoints and savepoints of a running
job at round boundaries (aligned barriers, see ``checkpoint.py``) and puts a
job back into the state of one.

A snapshot holds, per operator (named by its uid), every subtask's
input-channel watermarks (by input index, so they survive new operators
upstream) and operator state; per source subtask its split position and
watermark generator; the key codecs (by the uid of the keyed operator); and a
``SimulatedClock``'s time (so a restored simulated job sees the same
processing time; a system clock is not restored). Each keyed subtask's state
is that of its key-group range (stored beside it), so a job may restore at
another parallelism (``rescale.py``). A checkpoint completes when its
``_metadata`` is written; then every operator is notified (sinks commit their
pending files).

**Uids** (Flink's ``uid()``). State is matched by operator uid on restore.
An operator without one gets an id from its place in the graph (index, kind,
name), which changes when operators are added before it: its state then no
longer restores, so a snapshot warns (``MissingUidWarning``) about every
stateful operator without a uid. An operator new in the job starts empty;
state in a snapshot that no operator of the job takes fails the restore
(it would be lost silently) unless ``allow_non_restored_state=True``
(Flink's ``--allowNonRestoredState``); operators whose state is empty
(stateless ones) are dropped without asking, as Flink does.
"""

from __future__ import annotations

import hashlib
import os
import warnings

import torch
from opforge.stream.checkpoint import (CheckpointRestoreError, StateEncoder, completed_checkpoints,
                                       read_checkpoint, retain, sweep_incomplete, write_checkpoint)
from opforge.stream.operator_state import notify_checkpoint_complete, restore_operator, snapshot_operator
from opforge.stream.partitioning import MAX_PARALLELISM
from opforge.stream.rescale import fit_channels, key_group_range, rescale_source, rescale_subtasks
from opforge.stream.time import SimulatedClock


class MissingUidWarning(UserWarning):
    """A stateful operator without a uid: its state does not survive changes to the job graph."""


def operator_uids(transformations) -> list[str]:
    """Each operator's uid: the one set with ``DataStream.uid``, or one derived
    from the graph as Flink does: its place, kind and name, behind a hash of
    its inputs' uids, so it changes with anything upstream up to an operator
    with a uid of its own (sources: place, kind and name)."""
    uids: dict[int, str] = {}
    for index, t in enumerate(transformations):
        if t.uid is not None:
            uids[t.id] = t.uid
            continue
        uid = f"{index}:{t.kind}:{t.name}"
        if t.inputs:
            upstream = "|".join(f"{uids[i.upstream.id]}/{i.tag.tag_id if i.tag else ''}" for i in t.inputs)
            uid = f"{hashlib.sha1(upstream.encode()).hexdigest()[:8]}:{uid}"
        uids[t.id] = uid
    return [uids[t.id] for t in transformations]


class CheckpointCoordinator:
    def __init__(self, env, transformations, nodes, job_name: str):
        self.env, self.transformations, self.nodes, self.job_name = env, transformations, nodes, job_name
        self.config = getattr(env, "checkpoint_config", None)
        self.uids = operator_uids(transformations)
        if len(set(self.uids)) != len(self.uids):
            dup = next(u for u in self.uids if self.uids.count(u) > 1)
            raise ValueError(f"execute({job_name!r}): two operators have the uid {dup!r}; uids must be unique")
        self.channels = _Channels(nodes)
        self.warned: set[str] = set()
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
        """``(uid, input index, KeySpace)`` of every keyed input."""
        for uid, t in zip(self.uids, self.transformations):
            for i, inp in enumerate(t.inputs):
                if inp.key is not None:
                    yield uid, i, inp.key.space

    def _encode(self, checkpoint_id: int):
        enc = StateEncoder()
        ops, sources, stateful = {}, {}, set()
        for uid, t in zip(self.uids, self.transformations):
            node = self.nodes[t.id]
            if t.kind == "source":
                sources[uid] = [enc.encode(_source_state(r), f"source {t.name!r} (subtask {r.index})")
                                for r in node.runners]
                continue
            subtasks = []
            for r in node.runners:
                where = f"operator {t.name!r} (subtask {r.index})"
                raw = snapshot_operator(r.op, checkpoint_id)
                if holds_state(raw):
                    stateful.add(uid)
                state = {k: ({n: enc.encode(v, f"{where}, state {n!r}") for n, v in s.items()}
                             if k == "keyed_state" else enc.encode(s, f"{where}, {k.replace('_', ' ')}"))
                         for k, s in raw.items()}
                inputs = self.channels.input_of
                subtasks.append({"key_groups": key_group_range(r.index, len(node.runners)),
                                 "channels": enc.encode([[inputs[e], u, w, r.idle[(e, u)]]
                                                         for (e, u), w in r.wms.items()], where),
                                 "current": r.current, "out_idle": r.out_idle, "operator": state})
            ops[uid] = subtasks
        spaces: dict = {}
        for uid, i, space in self._key_spaces():
            spaces.setdefault(uid, []).append([i, enc.encode([space.identity, *space.codec.state()],
                                                             "the key codec of a key_by")])
        clock = self.env.clock
        tree = {"checkpoint_id": checkpoint_id, "max_parallelism": MAX_PARALLELISM, "operators": ops,
                "sources": sources, "kinds": {u: t.kind for u, t in zip(self.uids, self.transformations)},
                "key_spaces": spaces, "clock": clock.now() if isinstance(clock, SimulatedClock) else None}
        self._warn_missing_uids(stateful | set(sources))
        return tree, enc.tensors

    def _warn_missing_uids(self, stateful: set) -> None:
        """Warn once per operator that holds state under an id from its place in the graph."""
        for uid, t in zip(self.uids, self.transformations):
            if t.uid is None and uid in stateful and uid not in self.warned:
                self.warned.add(uid)
                warnings.warn(f"operator {t.name!r} ({t.kind}) has state but no uid: it is stored as {uid!r}, "
                              "an id from its place in the job graph, and will not be restored if the graph "
                              "changes before it; set one with .uid(...)", MissingUidWarning, stacklevel=2)

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
    def restore(self, path: str, allow_non_restored_state: bool = False) -> None:
        meta, tree = read_checkpoint(path, self.env.device)
        if tree.get("max_parallelism", MAX_PARALLELISM) != MAX_PARALLELISM:
            raise CheckpointRestoreError(f"restore_from {path}: the checkpoint has {tree['max_parallelism']} key "
                                         f"groups, this engine {MAX_PARALLELISM}")
        self._check_fit(path, tree, allow_non_restored_state)
        self.next_id = max(self.next_id, meta["checkpoint_id"] + 1)
        spaces = tree["key_spaces"]
        for uid, i, space in self._key_spaces():
            saved = dict((j, s) for j, s in spaces.get(uid, []))
            if i in saved:
                identity, *codec = saved[i]
                space.identity = identity
                if len(codec) == 1:  # [identity, values]: written when ids were dense, by first sight
                    codec = [None, *codec]
                space.codec.restore(*codec)
        if tree["clock"] is not None and isinstance(self.env.clock, SimulatedClock):
            self.env.clock._now = tree["clock"]
        for uid, t in zip(self.uids, self.transformations):
            runners = self.nodes[t.id].runners
            states = (tree["sources"] if t.kind == "source" else tree["operators"]).get(uid)
            if states is None:  # new in this job: starts empty (its watermarks too, as in Flink)
                continue
            if t.kind != "source":
                states = [{**s, "channels": self.channels.to_edges(t.id, s["channels"])} for s in states]
            if len(states) != len(runners):  # rescaling: key groups move between subtasks
                states = rescale_source(t.params["source"], t.name, states, len(runners)) if t.kind == "source" \
                    else rescale_subtasks(t.name, [r.op for r in runners], states, [list(r.wms) for r in runners])
            for r, s in zip(runners, states):
                if t.kind == "source":
                    _restore_source(r, s, self.env.clock)
                    continue
                for e, u, w, idle in self.channels.fit(s["channels"], list(r.wms)):
                    r.wms[(e, u)], r.idle[(e, u)] = w, idle
                r.current, r.out_idle = s["current"], s["out_idle"]
                restore_operator(r.op, s["operator"])
        self.last_time = self.env.clock.now()

    def _check_fit(self, path: str, tree: dict, allow_non_restored_state: bool) -> None:
        """Refuse a snapshot whose state the job would lose or misread."""
        kinds = dict(zip(self.uids, (t.kind for t in self.transformations)))
        saved_kinds = tree.get("kinds", {})
        for uid, kind in saved_kinds.items():
            if uid in kinds and kinds[uid] != kind:
                raise CheckpointRestoreError(f"restore_from {path}: the job graph differs from the checkpoint's "
                                             f"(operator {uid!r} is a {kind} there, a {kinds[uid]} in the job)")
        lost = [u for u in tree["sources"] if u not in kinds]
        lost += [u for u, subtasks in tree["operators"].items()
                 if u not in kinds and any(holds_state(s["operator"]) for s in subtasks)]
        if lost and not allow_non_restored_state:
            raise CheckpointRestoreError(
                f"restore_from {path}: the job graph differs from the checkpoint's: it holds state of operators "
                f"the job does not have ({', '.join(map(repr, lost))}); give operators uids (.uid) so state is "
                "matched by them, or pass allow_non_restored_state=True to drop that state")


def holds_state(op_state: dict) -> bool:
    """Whether an operator subtask's snapshot holds state (not only watermarks and counters)."""
    for name, v in op_state.items():
        if name in ("watermark", "timer_watermark", "late_dropped"):
            continue
        if name == "keyed_state":
            found = any(s["entries"] for s in v.values())
        elif name == "window_table":
            found = v["key"].numel() > 0
        elif name == "rolling":
            found = bool(v["slot_of"]) or bool(v["acc"])
        else:
            found = v.numel() > 0 if isinstance(v, torch.Tensor) else bool(v)
        if found:
            return True
    return False


class _Channels:
    """Input channels as the executor names them, ``(edge, upstream subtask)``,
    and as a snapshot does, ``[input index, upstream subtask, ...]``: edge
    numbers change when operators are added or removed, input indexes do not."""

    def __init__(self, nodes):
        self.input_of: dict[int, int] = {}  # edge -> input index of its downstream operator
        self.edge_of: dict[tuple, int] = {}  # (node id, input index) -> edge
        for n in nodes.values():
            for r in n.runners:
                for e in r.out.edges:
                    self.input_of[e.idx] = e.input_index
                    self.edge_of[(e.down.t.id, e.input_index)] = e.idx

    def to_edges(self, node_id: int, channels: list) -> list:
        return [[self.edge_of[(node_id, i)], u, w, idle] for i, u, w, idle in channels
                if (node_id, i) in self.edge_of]

    @staticmethod
    def fit(channels: list, actual: list) -> list:
        """Saved channels onto a subtask's actual ones (upstream parallelism may differ)."""
        return fit_channels([{"channels": channels}], actual)


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

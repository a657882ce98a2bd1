"""Rescaling: a checkpoint taken at parallelism ``p`` restores at any ``p'``
(Flink's key groups).

Keys are hashed into a fixed number of key groups (``MAX_PARALLELISM``, 128)
and key group ``g`` lives on subtask ``g * p // MAX_PARALLELISM``
(``partitioning.key_group_targets``), so every subtask of a keyed operator
holds the whole state of a contiguous range of key groups. A checkpoint
records each subtask's range; at a new parallelism a subtask takes the key
groups of its new range from whichever old subtasks held them: keyed state,
timers, window contents, rolling and columnar tables are filtered by the key
group of their key (one vectorized hash over the key ids for the columnar
tables) and merged. Timers keep their firing order (a stable merge by time).

Beyond keyed state: a subtask's watermarks restart from the minimum over the
old subtasks (equal anyway behind a key-hashed, all-to-all edge); counters
(late records) go to subtask 0; a source is rescaled only when it can deal
its splits' positions anew (``Source.rescale_positions``, e.g. the stream
partitions of ``NatsSource``); a sink joins through
``restore_rescaled(subtask, [(old subtask, state), ...])``. Operators with
state of their own (``snapshot_state``) join through a class method
``rescale_state(states, parallelism)``; any other refuses with
``CheckpointRestoreError`` rather than lose state.
"""

from __future__ import annotations

import torch

from opforge.stream.checkpoint import CheckpointRestoreError
from opforge.stream.partitioning import MAX_PARALLELISM, key_group_targets
from opforge.stream.records import concat_columns, take
from opforge.stream.time import MIN_WATERMARK


def key_group_range(subtask: int, parallelism: int) -> list[int]:
    """``[first, end)`` of the key groups subtask ``subtask`` of ``parallelism`` owns."""
    return [-(-subtask * MAX_PARALLELISM // parallelism), -(-(subtask + 1) * MAX_PARALLELISM // parallelism)]


class _Owners:
    """Which new subtask owns a key (key ids, or user keys through the key codec)."""

    def __init__(self, key_selector, parallelism: int):
        self.sel, self.p = key_selector, parallelism

    def of_ids(self, ids) -> torch.Tensor:
        ids = torch.as_tensor(ids, dtype=torch.int64)
        return key_group_targets(ids, self.p)

    def of_id_list(self, ids: list) -> list[int]:
        return self.of_ids(ids).tolist() if ids else []

    def of_user_keys(self, keys: list) -> list[int]:
        if not keys:
            return []
        if self.sel.identity:
            return self.of_id_list(keys)
        id_of = self.sel.codec.id_of
        return self.of_id_list([id_of(k) for k in keys])


def rescale_source(source, name: str, states: list[dict], parallelism: int) -> list[dict]:
    """Source subtask states for ``parallelism`` subtasks (positions dealt by the source)."""
    deal = getattr(source, "rescale_positions", None)
    if not callable(deal):
        raise CheckpointRestoreError(
            f"restore_from: source {name!r} had parallelism {len(states)}, the job gives it {parallelism}, and "
            f"{type(source).__name__} cannot deal its positions anew; keep its parallelism (set_parallelism)")
    positions = deal([s["position"] for s in states], parallelism)
    finished = all(s["finished"] for s in states)
    base = {"finished": finished, "idle": False, "last_record_ms": min(s["last_record_ms"] for s in states),
            "prev_ts": states[0]["prev_ts"], "wm_max": min(s["wm_max"] for s in states),
            "wm_emitted": min(s["wm_emitted"] for s in states)}
    return [{**base, "position": p} for p in positions]


def rescale_subtasks(op_name: str, ops: list, states: list[dict], channels_of: list) -> list[dict]:
    """Subtask states (``coordinator``'s) of one operator for ``len(ops)`` subtasks.
    ``ops``: the new subtasks' operators; ``channels_of[i]``: subtask i's input channels."""
    p = len(ops)
    sel = getattr(ops[0], "key_selector", None)
    owners = _Owners(sel, p) if sel is not None else None
    operator_states = [s["operator"] for s in states]
    if "own" in operator_states[0]:
        hook = getattr(type(ops[0]), "rescale_state", None)
        if not callable(hook):
            raise CheckpointRestoreError(f"restore_from: operator {op_name!r} ({type(ops[0]).__name__}) had "
                                         f"parallelism {len(states)}, the job gives it {p}, and it cannot be rescaled")
        owns = hook([s["own"] for s in operator_states], p)
        new_ops = [{"own": o} for o in owns]
    else:
        new_ops = _rescale_operator(op_name, owners, operator_states, p)
    wm = min(s["watermark"] for s in operator_states)
    out = []
    for i in range(p):
        new_ops[i]["watermark"] = wm
        out.append({"channels": fit_channels(states, channels_of[i]), "current": min(s["current"] for s in states),
                    "out_idle": all(s["out_idle"] for s in states), "operator": new_ops[i]})
    return out


def fit_channels(states: list[dict], channels: list) -> list:
    """A new subtask's input channels: the minimum watermark the old subtasks had on
    the same channel (or on the same edge, for a channel that did not exist)."""
    by_channel: dict = {}
    by_edge: dict = {}
    for s in states:
        for e, u, w, idle in s["channels"]:
            by_channel.setdefault((e, u), []).append((w, idle))
            by_edge.setdefault(e, []).append((w, idle))
    out = []
    for e, u in channels:
        seen = by_channel.get((e, u)) or by_edge.get(e) or [(MIN_WATERMARK, False)]
        out.append([e, u, min(w for w, _ in seen), all(i for _, i in seen)])
    return out


def _refuse(op_name: str, what: str, n: int, p: int):
    return CheckpointRestoreError(f"restore_from: operator {op_name!r} had parallelism {n}, the job gives it {p}, "
                                  f"and its {what} is not keyed")


def _rescale_operator(op_name: str, owners, states: list[dict], p: int) -> list[dict]:
    n = len(states)
    first = states[0]
    news = [{} for _ in range(p)]
    for field in first:
        if field == "watermark":
            continue
        values = [s[field] for s in states]
        if field == "timer_watermark":
            parts = [min(values)] * p
        elif field in ("late_dropped",):
            parts = [sum(values)] + [0] * (p - 1)
        elif field == "sink":
            parts = [{"rescaled": [[j, v] for j, v in enumerate(values) if j % p == i and v is not None]}
                     for i in range(p)]
        elif owners is None:
            if any(_nonempty(v) for v in values):
                raise _refuse(op_name, field.replace("_", " "), n, p)
            parts = [values[0]] * p
        elif field in ("event_timers", "processing_timers"):
            parts = _split_timers(values, p, owners.of_user_keys)
        elif field in ("fire_timers", "trigger_processing_timers", "cleanup_timers"):
            parts = _split_timers(values, p, owners.of_id_list)
        elif field == "keyed_state":
            parts = _split_keyed_state(values, p, owners)
        elif field in ("window_contents", "trigger_state"):
            parts = _split_dicts(values, p, lambda ks: owners.of_id_list([k for k, _ in ks]))
        elif field == "sessions":
            parts = _split_dicts(values, p, owners.of_id_list)
        elif field == "window_table":
            parts = _split_table(values, p, owners)
        elif field == "rolling":
            parts = _split_rolling(values, p, owners)
        else:
            raise CheckpointRestoreError(f"restore_from: operator {op_name!r} had parallelism {n}, the job gives "
                                         f"it {p}, and its {field!r} cannot be rescaled")
        for i in range(p):
            news[i][field] = parts[i]
    return news


def _nonempty(v) -> bool:
    return bool(v) if isinstance(v, (list, dict, set)) else False


def _split_timers(values: list[list], p: int, owner_of) -> list[list]:
    """Timers ``[ts, key, ns]`` by owner, each part in firing order (a stable merge by time)."""
    merged = sorted((t for v in values for t in v), key=lambda t: t[0])
    owners = owner_of([t[1] for t in merged])
    parts = [[] for _ in range(p)]
    for t, o in zip(merged, owners):
        parts[o].append(t)
    return parts


def _split_dicts(values: list[dict], p: int, owners_of_keys) -> list[dict]:
    parts = [{} for _ in range(p)]
    for d in values:
        keys = list(d)
        for k, o in zip(keys, owners_of_keys(keys)):
            parts[o][k] = d[k]
    return parts


def _split_keyed_state(values: list[dict], p: int, owners: _Owners) -> list[dict]:
    parts = [{} for _ in range(p)]
    for snapshot in values:
        for name, s in snapshot.items():
            entries = s["entries"]
            for e, o in zip(entries, owners.of_user_keys([e[0] for e in entries])):
                part = parts[o].setdefault(name, {"kind": s["kind"], "ttl": s["ttl"], "entries": []})
                part["entries"].append(e)
    for snapshot in values:  # every part declares every state, even with no entries of its own
        for name, s in snapshot.items():
            for part in parts:
                part.setdefault(name, {"kind": s["kind"], "ttl": s["ttl"], "entries": []})
    return parts


def _split_table(values: list[dict], p: int, owners: _Owners) -> list[dict]:
    """Columnar window tables: rows by the key group of their key column, on the device."""
    keys = torch.cat([t["key"].to(torch.int64) for t in values])
    cols = {n: concat_columns([t[n] for t in values]) for n in ("start", "count")}
    acc = {n: concat_columns([t["acc"][n] for t in values]) for n in values[0]["acc"]}
    target = owners.of_ids(keys.cpu()).to(keys.device)
    parts = []
    for i in range(p):
        rows = torch.nonzero(target == i).flatten()
        parts.append({"layout": values[0]["layout"], "key": keys.index_select(0, rows),
                      **{n: take(c, rows) for n, c in cols.items()},
                      "acc": {n: take(c, rows) for n, c in acc.items()}})
    return parts


def _split_rolling(values: list[dict], p: int, owners: _Owners) -> list[dict]:
    """Rolling aggregates: the record path's dict and the columnar table's rows by owner."""
    accs = _split_dicts([v["acc"] for v in values], p, owners.of_id_list)
    parts = []
    for i in range(p):
        slot_of, firsts, running = {}, [], []
        for v in values:
            if not v["slot_of"]:
                continue
            keys = list(v["slot_of"])
            mine = [k for k, o in zip(keys, owners.of_id_list(keys)) if o == i]
            rows = torch.tensor([v["slot_of"][k] for k in mine], dtype=torch.int64)
            for k in mine:
                slot_of[k] = len(slot_of)
            firsts.append({n: take(c, rows) for n, c in v["first"].items()})
            running.append(take(v["running"], rows))
        cols = ({n: concat_columns([f[n] for f in firsts]) for n in firsts[0]} if firsts else {})
        parts.append({"acc": accs[i], "slot_of": slot_of, "first": cols,
                      "running": torch.cat(running) if running else None,
                      "schema": next((v["schema"] for v in values if v["schema"] is not None), None)})
    return parts

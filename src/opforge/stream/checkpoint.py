"""Checkpoints and savepoints: configuration, the state codec, durable storage.

**Aligned barriers.** The executor runs a job in rounds: each round polls
every source subtask once and pushes each polled batch through the whole graph
(synchronously, depth first) before the next poll. At the end of a round no
record is in flight on any channel, and every operator has processed exactly
the records that came from the sources' current positions. That is the state
Flink's *aligned* checkpoint barriers produce (a barrier after position ``p``
of every source split; each operator snapshots once the barrier has arrived
on all its inputs, having processed exactly the records before it), so a
checkpoint taken at a round boundary is an exactly-once checkpoint without
any barrier records. ``AT_LEAST_ONCE`` is accepted and behaves the same.

**What is stored.** One tree per job: the source splits' positions and
watermark generators, every subtask's input-channel watermarks and operator
state (keyed state with its TTL stamps, timers, window contents, watermarks),
the key codecs (ids of non-int keys) and the sinks' pending transactions.
Values are encoded as tagged JSON (``state.json``) and tensors as an Arrow
IPC table (``tensors.arrow``): nothing is pickled, so a checkpoint can be read
back without running code from it. A value of another type raises
``CheckpointSerializationError`` naming the operator and the state.

**Layout.** ``<dir>/chk-<id>/{state.json, tensors.arrow, _metadata}``. A
checkpoint is written into a temporary directory, ``_metadata`` last, then
renamed: a ``chk-*`` directory holding ``_metadata`` is complete; anything
else is debris of a crash and ignored (and swept by the next job).
"""

from __future__ import annotations

import base64
import dataclasses
import json
import math
import os
import re
import shutil
import time as _time
from dataclasses import dataclass

import torch

from opforge.runtime import durable_files
from opforge.stream.state_types import (is_state_class, register_state_type, registered_state_type,
                                        state_type_name)

FORMAT_VERSION = 2  # 2: state matched by operator uid, input channels by input index
METADATA = "_metadata"
_CHK = re.compile(r"^chk-(\d+)$")


class CheckpointSerializationError(TypeError):
    """A state value a checkpoint cannot store without pickle."""


class CheckpointRestoreError(ValueError):
    """A checkpoint that does not exist, is incomplete or does not fit the job."""


@dataclass
class CheckpointConfig:
    """Flink's ``CheckpointConfig``: ``interval_ms`` of processing time between
    checkpoints (0: after every round), where they go, how many to keep."""

    interval_ms: int
    checkpoint_dir: str
    mode: str = "EXACTLY_ONCE"
    max_retained_checkpoints: int = 1

    def __post_init__(self):
        if isinstance(self.interval_ms, bool) or not isinstance(self.interval_ms, int) or self.interval_ms < 0:
            raise ValueError(f"enable_checkpointing: interval_ms must be a non-negative int, got {self.interval_ms!r}")
        if not isinstance(self.checkpoint_dir, (str, os.PathLike)) or not str(self.checkpoint_dir):
            raise ValueError("enable_checkpointing: checkpoint_dir must be a directory path")
        self.checkpoint_dir = os.fspath(self.checkpoint_dir)
        if self.mode not in ("EXACTLY_ONCE", "AT_LEAST_ONCE"):
            raise ValueError(f"enable_checkpointing: mode is EXACTLY_ONCE or AT_LEAST_ONCE, got {self.mode!r}")
        if not isinstance(self.max_retained_checkpoints, int) or self.max_retained_checkpoints < 1:
            raise ValueError("enable_checkpointing: max_retained_checkpoints must be a positive int")


# -- the codec: Python values <-> tagged JSON + tensors ------------------------

_ALLOWED = ("None, bool, int, float, str, bytes, list, tuple, dict, set, torch tensors, "
            "TimeWindow, dataclasses and namedtuples of those")


class StateEncoder:
    """Encodes a tree of values; tensors are collected apart (Arrow IPC)."""

    def __init__(self):
        self.tensors: dict[str, torch.Tensor] = {}

    def encode(self, value, where: str):
        """``value`` as JSON; ``where`` names it in errors (operator and state)."""
        return self._encode(value, where, "")

    def _encode(self, value, where: str, path: str):
        from opforge.stream.windows import TimeWindow

        enc = self._encode
        if value is None or isinstance(value, (bool, str)):
            return value
        if isinstance(value, int):
            return value
        if isinstance(value, float):
            return value if math.isfinite(value) else {"$f": repr(value)}
        if isinstance(value, torch.Tensor):
            name = f"t{len(self.tensors)}"
            self.tensors[name] = value.detach().to("cpu").contiguous()
            return {"$tensor": name}
        if isinstance(value, list):
            return [enc(v, where, f"{path}[{i}]") for i, v in enumerate(value)]
        if isinstance(value, TimeWindow):
            return {"$w": [value.start, value.end]}
        if isinstance(value, tuple) and hasattr(value, "_fields"):
            return {"$nt": _class_name(type(value)), "v": [enc(v, where, f"{path}.{f}")
                                                           for f, v in zip(value._fields, value)]}
        if isinstance(value, tuple):
            return {"$t": [enc(v, where, f"{path}[{i}]") for i, v in enumerate(value)]}
        if isinstance(value, dict):
            if all(isinstance(k, str) and not k.startswith("$") for k in value):
                return {k: enc(v, where, f"{path}.{k}") for k, v in value.items()}
            return {"$d": [[enc(k, where, f"{path}<key>"), enc(v, where, f"{path}[{k!r}]")]
                           for k, v in value.items()]}
        if isinstance(value, (set, frozenset)):
            items = [enc(v, where, f"{path}<item>") for v in value]
            return {"$set" if isinstance(value, set) else "$fset": items}
        if isinstance(value, (bytes, bytearray)):
            return {"$b": base64.b64encode(bytes(value)).decode("ascii")}
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return {"$dc": _class_name(type(value)),
                    "v": {f.name: enc(getattr(value, f.name), where, f"{path}.{f.name}")
                          for f in dataclasses.fields(value)}}
        item = getattr(value, "item", None)  # numpy scalars
        if callable(item) and type(value).__module__ == "numpy":
            return enc(item(), where, path)
        at = f" (at {path.lstrip('.')})" if path else ""
        raise CheckpointSerializationError(
            f"checkpoint: cannot serialize {where}{at}: a value of type {type(value).__module__}."
            f"{type(value).__qualname__} ({value!r:.80}); checkpoints store {_ALLOWED} (never pickle)")


def _class_name(cls) -> str:
    """The checkpoint's name of a dataclass / namedtuple class; encoding one
    registers it (``state_types.py``), so this process may restore it."""
    if "<locals>" in cls.__qualname__:
        raise CheckpointSerializationError(
            f"checkpoint: class {cls.__qualname__} is defined inside a function; a checkpointed "
            "dataclass / namedtuple must be importable by its module and name")
    register_state_type(cls)
    return state_type_name(cls)


def _resolve_class(name: str):
    """The registered state type ``name`` names; nothing else is imported or constructed."""
    cls = registered_state_type(name) if isinstance(name, str) else None
    if cls is None or not is_state_class(cls):
        raise CheckpointRestoreError(
            f"checkpoint: {name!r} is not a registered state type; a checkpoint constructs only the engine's "
            "own types and classes registered with opforge.stream.register_state_type(cls) (or encoded or "
            "seen as records in this process), and imports nothing it names")
    return cls


def schema_state(schema) -> list | None:
    """A record schema (``records.RecordSchema``) as checkpoint JSON: kind, field names, class."""
    if schema is None:
        return None
    return [schema.kind, list(schema.names), None if schema.cls is None else _class_name(schema.cls)]


def schema_from_state(s):
    from opforge.stream.records import RecordSchema

    if s is None:
        return None
    kind, names, cls = s
    return RecordSchema(kind, tuple(names), None if cls is None else _resolve_class(cls))


def decode(value, tensors: dict):
    from opforge.stream.windows import TimeWindow

    if isinstance(value, list):
        return [decode(v, tensors) for v in value]
    if not isinstance(value, dict):
        return value
    if len(value) == 1 or (len(value) == 2 and "v" in value):
        tag = next((k for k in value if k.startswith("$")), None)
        if tag == "$f":
            return float(value["$f"])
        if tag == "$tensor":
            return tensors[value["$tensor"]]
        if tag == "$w":
            return TimeWindow(*value["$w"])
        if tag == "$t":
            return tuple(decode(v, tensors) for v in value["$t"])
        if tag == "$d":
            return {_hashable(decode(k, tensors)): decode(v, tensors) for k, v in value["$d"]}
        if tag == "$set":
            return {_hashable(decode(v, tensors)) for v in value["$set"]}
        if tag == "$fset":
            return frozenset(_hashable(decode(v, tensors)) for v in value["$fset"])
        if tag == "$b":
            return base64.b64decode(value["$b"])
        if tag == "$nt":
            return _resolve_class(value["$nt"])(*decode(value["v"], tensors))
        if tag == "$dc":
            return _resolve_class(value["$dc"])(**decode(value["v"], tensors))
    return {k: decode(v, tensors) for k, v in value.items()}


def _hashable(v):
    return tuple(_hashable(x) for x in v) if isinstance(v, list) else v


# -- tensors as Arrow IPC -------------------------------------------------------

def tensors_table(tensors: dict[str, torch.Tensor]):
    """Named tensors as one Arrow table (name, dtype, shape, raw bytes): no pickle."""
    import pyarrow as pa

    names = list(tensors)
    return pa.table({
        "name": pa.array(names, pa.string()),
        "dtype": pa.array([str(tensors[n].dtype).removeprefix("torch.") for n in names], pa.string()),
        "shape": pa.array([list(tensors[n].shape) for n in names], pa.list_(pa.int64())),
        "data": pa.array([tensors[n].reshape(-1).view(torch.uint8).numpy().tobytes() if tensors[n].numel()
                          else b"" for n in names], pa.large_binary()),
    })


def write_tensors(path: str, tensors: dict[str, torch.Tensor]) -> None:
    import pyarrow as pa

    table = tensors_table(tensors)
    with pa.OSFile(path, "wb") as f, pa.ipc.new_file(f, table.schema) as w:
        w.write_table(table)


def tensors_of_table(table, device) -> dict[str, torch.Tensor]:
    """The tensors of a ``tensors_table``, on ``device``."""
    out = {}
    for name, dtype, shape, data in zip(*(table.column(c).to_pylist() for c in ("name", "dtype", "shape", "data"))):
        dt = getattr(torch, dtype)
        flat = torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dt) if data else torch.empty(0, dtype=dt)
        out[name] = flat.reshape(shape).to(device)
    return out


def read_tensors(path: str, device) -> dict[str, torch.Tensor]:
    import pyarrow as pa

    with pa.memory_map(path) as f:
        table = pa.ipc.open_file(f).read_all()
    return tensors_of_table(table, device)


# -- storage ----------------------------------------------------------------------

_fsync_dir = durable_files.fsync_dir


def _write_file(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def write_checkpoint(target: str, checkpoint_id: int, kind: str, job_name: str, encoded,
                     tensors: dict, operators: list[str]) -> str:
    """Write an encoded tree (``StateEncoder``) atomically to the directory ``target``."""
    parent = os.path.dirname(os.path.abspath(target))
    os.makedirs(parent, exist_ok=True)
    if os.path.exists(os.path.join(target, METADATA)):
        raise CheckpointRestoreError(f"{kind}: {target} already holds a completed checkpoint")
    tmp = os.path.join(parent, f".{os.path.basename(target)}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    _write_file(os.path.join(tmp, "state.json"), json.dumps(encoded, separators=(",", ":")).encode())
    write_tensors(os.path.join(tmp, "tensors.arrow"), tensors)
    meta = {"format_version": FORMAT_VERSION, "checkpoint_id": checkpoint_id, "type": kind,
            "job_name": job_name, "timestamp_ms": int(_time.time() * 1000), "operators": operators,
            "files": ["state.json", "tensors.arrow"]}
    _write_file(os.path.join(tmp, METADATA), json.dumps(meta, indent=1).encode())
    _fsync_dir(tmp)
    if os.path.isdir(target):  # an incomplete leftover with the same name
        shutil.rmtree(target)
    os.rename(tmp, target)
    _fsync_dir(parent)
    return target


def completed_checkpoints(checkpoint_dir: str) -> list[tuple[int, str]]:
    """``(id, path)`` of the complete ``chk-*`` directories, oldest first."""
    if not os.path.isdir(checkpoint_dir):
        return []
    out = []
    for name in os.listdir(checkpoint_dir):
        m = _CHK.match(name)
        path = os.path.join(checkpoint_dir, name)
        if m and os.path.isfile(os.path.join(path, METADATA)):
            out.append((int(m.group(1)), path))
    return sorted(out)


def sweep_incomplete(checkpoint_dir: str) -> None:
    """Remove temporary and incomplete checkpoint directories (crash debris)."""
    if not os.path.isdir(checkpoint_dir):
        return
    for name in os.listdir(checkpoint_dir):
        path = os.path.join(checkpoint_dir, name)
        if (name.startswith(".chk-") and ".tmp-" in name) or \
                (_CHK.match(name) and not os.path.isfile(os.path.join(path, METADATA))):
            shutil.rmtree(path, ignore_errors=True)


def resolve_restore_path(path) -> str | None:
    """A checkpoint / savepoint directory as given, or the latest completed
    checkpoint under a checkpoint directory (None if it holds none yet)."""
    path = os.fspath(path)
    if os.path.isfile(os.path.join(path, METADATA)):
        return path
    if _CHK.match(os.path.basename(os.path.normpath(path))):
        raise CheckpointRestoreError(f"restore_from: {path} is an incomplete checkpoint (no {METADATA})")
    if not os.path.isdir(path):
        raise CheckpointRestoreError(f"restore_from: {path} does not exist")
    done = completed_checkpoints(path)
    return done[-1][1] if done else None


def read_checkpoint(path: str, device) -> tuple[dict, dict]:
    """``(metadata, state tree)`` of a completed checkpoint or savepoint."""
    meta_path = os.path.join(path, METADATA)
    if not os.path.isfile(meta_path):
        raise CheckpointRestoreError(f"restore_from: {path} is not a completed checkpoint (no {METADATA})")
    with open(meta_path, encoding="utf-8") as f:
        meta = json.load(f)
    if meta.get("format_version") != FORMAT_VERSION:
        raise CheckpointRestoreError(f"restore_from: {path} has format version {meta.get('format_version')}, "
                                     f"expected {FORMAT_VERSION}")
    tensors = read_tensors(os.path.join(path, "tensors.arrow"), device)
    with open(os.path.join(path, "state.json"), encoding="utf-8") as f:
        tree = decode(json.load(f), tensors)
    return meta, tree


def retain(checkpoint_dir: str, keep: int) -> None:
    """Drop all but the newest ``keep`` completed checkpoints."""
    done = completed_checkpoints(checkpoint_dir)
    for _, path in done[:-keep]:
        shutil.rmtree(path, ignore_errors=True)

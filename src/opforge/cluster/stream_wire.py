"""Stream records and state between workers: what goes over the cluster's process group.

A micro-batch (``stream.records.Batch``) travels as one Arrow IPC stream: its columns, then its
timestamps, key ids, record watermarks and arrival positions under reserved names, with the record
schema and which columns were tensors in the schema's metadata (JSON). Nothing is pickled, so a
worker never runs code that a peer sent it.

A round's messages for one worker are packed into one byte string (a JSON header per message, then
its Arrow body); :func:`exchange_bytes` moves every worker's byte strings in one all-to-all
(``opforge.distributed.shuffle_batch``: NCCL on GPUs, Gloo on CPU).
"""
from __future__ import annotations

import json
import struct

import pyarrow as pa
import torch

import opforge.distributed as D
from opforge.cluster import regions as R
from opforge.stream.checkpoint import schema_from_state, schema_state
from opforge.stream.records import Batch

_RESERVED = {"timestamps": "__opforge_ts", "keys": "__opforge_keys", "watermarks": "__opforge_wm",
             "arrival": "__opforge_arrival"}
_PLAIN = (str, bytes, bool, int, float, type(None))


def _list_array(name: str, values: list) -> pa.Array:
    if not all(isinstance(v, _PLAIN) for v in values):
        bad = next(v for v in values if not isinstance(v, _PLAIN))
        raise TypeError(f"stream on a cluster: field {name!r} holds {type(bad).__name__} values ({bad!r:.60}); "
                        "records that move between workers hold numbers, bools, strings and bytes")
    try:
        return pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
        raise TypeError(f"stream on a cluster: field {name!r} mixes value types ({e})") from None


def encode_batch(batch: Batch) -> bytes:
    cols, tensors = {}, []
    for name, c in batch.columns.items():
        if isinstance(c, torch.Tensor):
            cols[name] = pa.array(c.detach().cpu().numpy())
            tensors.append(name)
        else:
            cols[name] = _list_array(name, c)
    for attr, name in _RESERVED.items():
        t = getattr(batch, attr)
        if t is not None:
            cols[name] = pa.array(t.detach().cpu().numpy())
    meta = {"tensors": tensors, "schema": schema_state(batch.schema)}
    table = pa.table(cols).replace_schema_metadata({"opforge": json.dumps(meta)})
    return R.to_ipc(table)


def decode_batch(data: bytes, device) -> Batch:
    table = R.from_ipc(data)
    meta = json.loads(table.schema.metadata[b"opforge"])
    tensors = set(meta["tensors"])

    def tensor(name):
        arr = table.column(name).to_numpy(zero_copy_only=False)
        return torch.from_numpy(arr.copy()).to(device)

    reserved = set(_RESERVED.values())
    cols = {n: tensor(n) if n in tensors else table.column(n).to_pylist()
            for n in table.column_names if n not in reserved}
    extra = {attr: tensor(name) if name in table.column_names else None for attr, name in _RESERVED.items()}
    return Batch(cols, extra.pop("timestamps"), schema_from_state(meta["schema"]), **extra)


def pack(messages: list[tuple[dict, bytes]]) -> bytes:
    """Messages ``(header, body)`` as one byte string: per message, the lengths of both, then both."""
    parts = []
    for header, body in messages:
        h = json.dumps(header, separators=(",", ":")).encode()
        parts += [struct.pack("<II", len(h), len(body)), h, body]
    return b"".join(parts)


def unpack(data: bytes) -> list[tuple[dict, bytes]]:
    out, at, view = [], 0, memoryview(data)
    while at < len(data):
        nh, nb = struct.unpack_from("<II", data, at)
        at += 8
        out.append((json.loads(bytes(view[at:at + nh])), bytes(view[at + nh:at + nh + nb])))
        at += nh + nb
    return out


def exchange_bytes(outgoing: list[bytes]) -> list[bytes]:
    """``outgoing[d]`` to worker ``d``; returns what each worker sent here (by source). Collective."""
    device = D.device()
    payload = torch.frombuffer(bytearray(b"".join(outgoing)) or bytearray(1), dtype=torch.uint8)
    payload = payload[:sum(map(len, outgoing))].to(device)
    got, recv = D.shuffle_batch({"bytes": payload}, [len(b) for b in outgoing])
    flat = got["bytes"].cpu().numpy().tobytes()
    out, at = [], 0
    for n in recv.tolist():
        out.append(flat[at:at + n])
        at += n
    return out


def any_pending(count: int) -> bool:
    """Whether any worker has messages to send (``count``: this worker's). Collective."""
    t = torch.tensor([count], dtype=torch.int64, device=D.device())
    torch.distributed.all_reduce(t)
    return int(t.item()) > 0


def any_of(flags: list[bool]) -> list[bool]:
    """Per position, whether any worker's flag is set (each worker sets those it knows). Collective."""
    t = torch.tensor([int(f) for f in flags], dtype=torch.int64, device=D.device())
    torch.distributed.all_reduce(t)
    return (t > 0).tolist()


__all__ = ["encode_batch", "decode_batch", "pack", "unpack", "exchange_bytes", "any_pending", "any_of"]

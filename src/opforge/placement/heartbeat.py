"""Heartbeat messages: what workers report, and what the driver answers.

The wire form is JSON (schema version ``SCHEMA_VERSION``). ``parse_*``
validate a decoded JSON object and raise ``HeartbeatError`` naming the field,
so a malformed heartbeat is refused without disturbing the driver.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from opforge.placement.cluster import Peer, PeerRole, Region, RegionEpoch, Store, StoreState

SCHEMA_VERSION = 1
# Ids and figures are unsigned 64-bit, as in PD: every integer field is in [0, MAX_UINT64].
MAX_UINT64 = 2 ** 64 - 1
MAX_ADDRESS_LEN = 1024  # characters of a store's address
MAX_LABELS = 64  # labels of one store
MAX_LABEL_LEN = 256  # characters of a label's key or value


class HeartbeatError(ValueError):
    """A heartbeat that cannot be applied: malformed, unknown store, stale epoch."""


def _field(d: dict, name: str, kind, where: str, default=...):
    if name not in d:
        if default is ...:
            raise HeartbeatError(f"{where}: missing field {name!r}")
        return default
    v = d[name]
    if kind is int and (isinstance(v, bool) or not isinstance(v, int)):
        raise HeartbeatError(f"{where}: field {name!r} must be an integer, got {type(v).__name__}")
    if kind is int and (v < 0 or v > MAX_UINT64):
        raise HeartbeatError(f"{where}: field {name!r} must be an unsigned 64-bit integer (0 .. 2^64-1), got "
                             f"{_short(v)}")
    if kind is str and not isinstance(v, str):
        raise HeartbeatError(f"{where}: field {name!r} must be a string, got {type(v).__name__}")
    if kind is dict and not isinstance(v, dict):
        raise HeartbeatError(f"{where}: field {name!r} must be an object, got {type(v).__name__}")
    if kind is list and not isinstance(v, list):
        raise HeartbeatError(f"{where}: field {name!r} must be a list, got {type(v).__name__}")
    if kind is bool and not isinstance(v, bool):
        raise HeartbeatError(f"{where}: field {name!r} must be a boolean, got {type(v).__name__}")
    return v


def _short(v: int) -> str:
    """An integer for an error message: a huge one by its size, not its 400 digits."""
    return str(v) if abs(v) < 10 ** 30 else f"a {len(str(abs(v)))}-digit number"


def _key(text: str, where: str, name: str) -> bytes:
    try:
        return bytes.fromhex(text)
    except (ValueError, TypeError):
        raise HeartbeatError(f"{where}: field {name!r} must be a hex string, got {text!r}") from None


@dataclass
class StoreHeartbeat:
    store: Store

    def to_json(self) -> dict[str, Any]:
        s = self.store
        return {"schema_version": SCHEMA_VERSION, "store_id": s.id, "address": s.address, "labels": s.labels,
                "state": s.state.value, "capacity": s.capacity, "available": s.available, "used_size": s.used_size,
                "region_count": s.region_count, "sending_snap_count": s.sending_snap_count,
                "receiving_snap_count": s.receiving_snap_count, "is_busy": s.is_busy,
                "bytes_written": s.bytes_written, "bytes_read": s.bytes_read, "keys_written": s.keys_written,
                "keys_read": s.keys_read, "query_num": s.query_num}


def parse_store_heartbeat(d: Any) -> StoreHeartbeat:
    if not isinstance(d, dict):
        raise HeartbeatError(f"store heartbeat must be a JSON object, got {type(d).__name__}")
    _check_version(d, "store heartbeat")
    sid = _field(d, "store_id", int, "store heartbeat")
    where = f"store heartbeat of store {sid}"
    labels = _field(d, "labels", dict, where, {})
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
        raise HeartbeatError(f"{where}: labels must map strings to strings")
    if len(labels) > MAX_LABELS or any(len(k) > MAX_LABEL_LEN or len(v) > MAX_LABEL_LEN for k, v in labels.items()):
        raise HeartbeatError(f"{where}: labels: at most {MAX_LABELS}, keys and values of at most {MAX_LABEL_LEN} "
                             "characters")
    address = _field(d, "address", str, where, "")
    if len(address) > MAX_ADDRESS_LEN:
        raise HeartbeatError(f"{where}: field 'address' is longer than {MAX_ADDRESS_LEN} characters "
                             f"({len(address)})")
    state = _field(d, "state", str, where, "up")
    try:
        state = StoreState(state)
    except ValueError:
        raise HeartbeatError(f"{where}: state must be one of {[s.value for s in StoreState]}, got {state!r}") from None
    capacity = _field(d, "capacity", int, where)
    available = _field(d, "available", int, where)
    if available > capacity:
        raise HeartbeatError(f"{where}: available ({available}) exceeds capacity ({capacity})")
    store = Store(
        id=sid, address=address, labels=dict(labels), state=state,
        capacity=capacity, available=available, used_size=_field(d, "used_size", int, where, capacity - available),
        region_count=_field(d, "region_count", int, where, 0),
        sending_snap_count=_field(d, "sending_snap_count", int, where, 0),
        receiving_snap_count=_field(d, "receiving_snap_count", int, where, 0),
        is_busy=_field(d, "is_busy", bool, where, False),
        bytes_written=_field(d, "bytes_written", int, where, 0), bytes_read=_field(d, "bytes_read", int, where, 0),
        keys_written=_field(d, "keys_written", int, where, 0), keys_read=_field(d, "keys_read", int, where, 0),
        query_num=_field(d, "query_num", int, where, 0),
    )
    return StoreHeartbeat(store)


@dataclass
class RegionHeartbeat:
    region: Region

    def to_json(self) -> dict[str, Any]:
        r = self.region
        return {
            "schema_version": SCHEMA_VERSION, "region_id": r.id, "start_key": r.start_key.hex(),
            "end_key": r.end_key.hex(), "epoch": {"conf_ver": r.epoch.conf_ver, "version": r.epoch.version},
            "peers": [{"id": p.id, "store_id": p.store_id, "role": p.role.value} for p in r.peers],
            "leader_peer_id": r.leader.id if r.leader else None,
            "approximate_size": r.approximate_size, "approximate_keys": r.approximate_keys,
            "written_bytes": r.written_bytes, "read_bytes": r.read_bytes, "written_keys": r.written_keys,
            "read_keys": r.read_keys, "query_num": r.query_num, "down_peers": list(r.down_peers),
            "pending_peers": list(r.pending_peers),
        }


def parse_region_heartbeat(d: Any) -> RegionHeartbeat:
    if not isinstance(d, dict):
        raise HeartbeatError(f"region heartbeat must be a JSON object, got {type(d).__name__}")
    _check_version(d, "region heartbeat")
    rid = _field(d, "region_id", int, "region heartbeat")
    where = f"region heartbeat of region {rid}"
    epoch = _field(d, "epoch", dict, where)
    peers = []
    for i, p in enumerate(_field(d, "peers", list, where)):
        if not isinstance(p, dict):
            raise HeartbeatError(f"{where}: peers[{i}] must be an object")
        role = _field(p, "role", str, f"{where} peers[{i}]", "voter")
        try:
            role = PeerRole(role)
        except ValueError:
            raise HeartbeatError(f"{where}: peers[{i}].role must be one of {[r.value for r in PeerRole]}") from None
        peers.append(Peer(_field(p, "id", int, f"{where} peers[{i}]"), _field(p, "store_id", int, f"{where} peers[{i}]"),
                          role))
    if not peers:
        raise HeartbeatError(f"{where}: a region needs at least one peer")
    if len({p.id for p in peers}) != len(peers) or len({p.store_id for p in peers}) != len(peers):
        raise HeartbeatError(f"{where}: peer ids and their stores must be distinct")
    leader_id = d.get("leader_peer_id")
    leader = next((p for p in peers if p.id == leader_id), None)
    if leader is None or not leader.is_voter:
        raise HeartbeatError(f"{where}: leader_peer_id {leader_id!r} is not a voter among the peers")
    start = _key(_field(d, "start_key", str, where, ""), where, "start_key")
    end = _key(_field(d, "end_key", str, where, ""), where, "end_key")
    if end and start >= end:
        raise HeartbeatError(f"{where}: start_key must sort before end_key")
    ids = {p.id for p in peers}
    down = tuple(_field(d, "down_peers", list, where, []))
    pending = tuple(_field(d, "pending_peers", list, where, []))
    for name, values in (("down_peers", down), ("pending_peers", pending)):
        if not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_UINT64 for v in values):
            raise HeartbeatError(f"{where}: {name} must list peer ids (unsigned 64-bit integers)")
    if not set(down) <= ids or not set(pending) <= ids:
        raise HeartbeatError(f"{where}: down_peers and pending_peers must name peers of the region")
    region = Region(
        id=rid, start_key=start, end_key=end,
        epoch=RegionEpoch(_field(epoch, "conf_ver", int, where), _field(epoch, "version", int, where)),
        peers=tuple(peers), leader=leader,
        approximate_size=_field(d, "approximate_size", int, where, 1),
        approximate_keys=_field(d, "approximate_keys", int, where, 0),
        written_bytes=_field(d, "written_bytes", int, where, 0), read_bytes=_field(d, "read_bytes", int, where, 0),
        written_keys=_field(d, "written_keys", int, where, 0), read_keys=_field(d, "read_keys", int, where, 0),
        query_num=_field(d, "query_num", int, where, 0), down_peers=down, pending_peers=pending,
    )
    return RegionHeartbeat(region)


def _check_version(d: dict, where: str) -> None:
    v = d.get("schema_version", SCHEMA_VERSION)
    if v != SCHEMA_VERSION:
        raise HeartbeatError(f"{where}: schema_version {v!r} is not supported (this driver speaks {SCHEMA_VERSION})")

"""Request parsing: the fast path for heartbeats of known regions, the
fallback to the full parser with worded errors, field checks of admin
requests, and the collector pause around heartbeat batches."""

from __future__ import annotations

import gc
import json
import threading
from typing import Any

from opforge.placement.cluster import Region
from opforge.placement.heartbeat import MAX_UINT64, SCHEMA_VERSION, HeartbeatError, RegionHeartbeat, \
    parse_region_heartbeat
from opforge.placement.service.errors import BadRequest


_FLOW_FIELDS = (("approximate_size", 1), ("approximate_keys", 0), ("written_bytes", 0), ("read_bytes", 0),
                ("written_keys", 0), ("read_keys", 0), ("query_num", 0))


def parse_known_region(d, regions: dict) -> RegionHeartbeat | None:
    """The fast path of region heartbeat parsing: the heartbeat of a region the
    driver knows, whose keys, epoch, peers and leader are exactly the known
    ones (what nearly every heartbeat is). Builds the same ``Region`` that
    ``parse_region_heartbeat`` would, reusing the known (immutable) epoch, peers
    and keys, and checking only the figures that change. Returns None for
    anything else -- new or changed regions, down or pending peers, any value
    of a wrong type -- which then goes through ``parse_region_heartbeat`` (the
    one place that words the errors)."""
    if type(d) is not dict:
        return None
    rid = d.get("region_id")
    if type(rid) is not int:
        return None
    known = regions.get(rid)
    if known is None or d.get("schema_version", SCHEMA_VERSION) != SCHEMA_VERSION:
        return None
    e = d.get("epoch")
    if type(e) is not dict:
        return None
    ke = known.epoch
    c, v = e.get("conf_ver"), e.get("version")
    if c != ke.conf_ver or v != ke.version or type(c) is not int or type(v) is not int:
        return None
    peers, kp = d.get("peers"), known.peers
    if type(peers) is not list or len(peers) != len(kp):
        return None
    for p, q in zip(peers, kp):
        if type(p) is not dict:
            return None
        pid, sid = p.get("id"), p.get("store_id")
        if pid != q.id or sid != q.store_id or type(pid) is not int or type(sid) is not int \
                or p.get("role", "voter") != q.role:  # PeerRole is a str enum: compares with its value
            return None
    leader, kl = d.get("leader_peer_id"), known.leader
    if kl is None or leader != kl.id or type(leader) is not int:
        return None
    if d.get("start_key", "") != known.start_key.hex() or d.get("end_key", "") != known.end_key.hex():
        return None
    down, pending = d.get("down_peers"), d.get("pending_peers")
    if (down is not None and down != []) or (pending is not None and pending != []):
        return None
    vals = []
    for name, default in _FLOW_FIELDS:
        x = d.get(name, default)
        if type(x) is not int or x < 0 or x > MAX_UINT64:
            return None
        vals.append(x)
    size, keys, wb, rb, wk, rk, q = vals
    return RegionHeartbeat(Region(
        id=rid, start_key=known.start_key, end_key=known.end_key, epoch=ke, peers=kp, leader=kl,
        approximate_size=size, approximate_keys=keys, written_bytes=wb, read_bytes=rb, written_keys=wk,
        read_keys=rk, query_num=q, down_peers=(), pending_peers=()))


class _GCPause:
    """Pause the cyclic garbage collector while a heartbeat batch is decoded and
    applied (re-entrant across threads: the last one out re-enables it).

    A batch of 5000 heartbeats is ~35k fresh containers that live until the
    batch is done; with the collector on they get promoted, inflate the
    "long-lived pending" count and set off full collections that walk the whole
    cluster (every Region, Peer, ...) -- measured at ~40% of the HTTP batch
    path. Heartbeat objects hold no reference cycles, so reference counting
    frees them all when the batch ends; nothing waits for the collector."""

    def __init__(self):
        self._lock = threading.Lock()
        self._depth = 0
        self._was_enabled = False

    def __enter__(self):
        with self._lock:
            if self._depth == 0:
                self._was_enabled = gc.isenabled()
                gc.disable()
            self._depth += 1

    def __exit__(self, *exc):
        with self._lock:
            self._depth -= 1
            if self._depth == 0 and self._was_enabled:
                gc.enable()


gc_paused = _GCPause()


def _parse_region(d, regions: dict | None = None):
    if regions is not None:
        hb = parse_known_region(d, regions)
        if hb is not None:
            return hb
    try:
        return parse_region_heartbeat(d)
    except HeartbeatError:
        raise
    except (TypeError, ValueError, KeyError, AttributeError) as e:  # escaped the parser's own checks
        raise HeartbeatError(_diagnose_region(d) or
                             f"region heartbeat of region {_rid(d)}: malformed: {type(e).__name__}: {e}") from None


def _diagnose_region(d) -> str:
    """Name the field behind an error that ``parse_region_heartbeat`` did not
    catch itself (it lets a non-integer in down_peers/pending_peers escape as
    TypeError). Only runs on the error path."""
    where = f"region heartbeat of region {_rid(d)}"
    for name in ("down_peers", "pending_peers"):
        items = d.get(name) if isinstance(d, dict) else None
        if isinstance(items, list):
            for i, v in enumerate(items):
                if isinstance(v, bool) or not isinstance(v, int):
                    return f"{where}: {name}[{i}] must be an integer peer id, got {type(v).__name__}"
    return ""


def _rid(d):
    return d.get("region_id") if isinstance(d, dict) else None


def _require(d: Any, name: str, kind, where: str):
    if not isinstance(d, dict):
        raise BadRequest(f"{where}: body must be a JSON object, got {type(d).__name__}")
    if name not in d:
        raise BadRequest(f"{where}: missing field {name!r}")
    v = d[name]
    if kind is int and (isinstance(v, bool) or not isinstance(v, int)):
        raise BadRequest(f"{where}: field {name!r} must be an integer, got {type(v).__name__}")
    if kind is str and not isinstance(v, str):
        raise BadRequest(f"{where}: field {name!r} must be a string, got {type(v).__name__}")
    return v


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not a JSON number (JSON has no NaN or Infinity)")


def loads_json(raw: bytes):
    """Decode a request body as strict JSON: ``NaN``, ``Infinity`` and
    ``-Infinity`` (which Python's decoder takes by default) are refused."""
    return json.loads(raw, parse_constant=_refuse_constant)

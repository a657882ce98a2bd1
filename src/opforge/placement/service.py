"""The placement driver as an HTTP/JSON service (FastAPI, served by uvicorn).

Workers send store and region heartbeats; each region heartbeat is answered
with the step its leader should run now (or none). Admins read and change the
cluster through the same API (``opforge pd ctl``). Endpoints live under
``/pd/api/v1``::

    POST   heartbeat/store              a store heartbeat
    POST   heartbeat/region             a region heartbeat -> {"region_id", "operator_id", "step"}
    POST   heartbeat/regions            a batch {"heartbeats": [...]} -> {"accepted", "steps", "errors"}
    POST   stores                       register a store (a worker joining)
    GET    stores | stores/{id}
    POST   stores/{id}/state            {"state": "up" | "offline" | "tombstone"}
    GET    regions?offset=&limit=&store_id=
    GET    regions/{id}
    GET    operators                    running operators and recent history
    POST   operators                    {"kind", "region_id", "to_store"?, "from_store"?}
    DELETE operators/{region_id}
    GET    schedulers | POST schedulers {"name", "args"?} | DELETE schedulers/{name}
    GET    config | PUT config {name: value, ...}
    GET    rules | PUT rules
    GET    schema/heartbeat             the versioned JSON Schema of the heartbeat messages
    GET    health

Every request needs ``Authorization: Bearer <token>`` (401 otherwise; the
token is compared in constant time). Bad input is answered 400 with a message
that names the field; the driver is not disturbed. One lock serializes every
use of the driver; a background thread runs ``driver.tick()`` every
``tick_interval`` seconds and flushes the storage.
"""

from __future__ import annotations

import copy
import gc
import hashlib
import hmac
import ipaddress
import itertools
import json
import logging
import os
import threading
import time
from contextlib import asynccontextmanager
from typing import Any, Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from opforge.placement.cluster import PeerRole, Region, StoreState
from opforge.placement.heartbeat import SCHEMA_VERSION, HeartbeatError, RegionHeartbeat, parse_region_heartbeat, \
    parse_store_heartbeat
from opforge.placement.storage import Storage, region_to_json, restore_rules, store_to_json

log = logging.getLogger(__name__)

API = "/pd/api/v1"
MAX_BATCH = 200_000  # region heartbeats in one batch request
MAX_PAGE = 10_000  # regions in one page
BATCH_LOCK_CHUNK = 4096  # heartbeats applied per lock hold, so ticks and admins interleave


# --------------------------------------------------------------------------
# The JSON Schema of heartbeat messages (versioned with heartbeat.SCHEMA_VERSION)
# --------------------------------------------------------------------------

def _uint(desc: str = "") -> dict:
    d: dict = {"type": "integer", "minimum": 0}
    if desc:
        d["description"] = desc
    return d


_HEX = {"type": "string", "pattern": "^([0-9a-fA-F]{2})*$"}

STORE_HEARTBEAT_SCHEMA: dict = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": f"opforge:pd/store-heartbeat/v{SCHEMA_VERSION}",
    "title": "StoreHeartbeat",
    "description": "What a worker (store) reports about itself, every few seconds.",
    "type": "object",
    "required": ["store_id", "capacity", "available"],
    "properties": {
        "schema_version": {"const": SCHEMA_VERSION},
        "store_id": _uint(),
        "address": {"type": "string"},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "state": {"enum": [s.value for s in StoreState],
                  "description": "ignored in heartbeats: the administrative state is the driver's"},
        "capacity": _uint("bytes given to data"),
        "available": _uint("bytes free; must not exceed capacity"),
        "used_size": _uint("bytes used (default capacity - available)"),
        "region_count": _uint(),
        "sending_snap_count": _uint(),
        "receiving_snap_count": _uint(),
        "is_busy": {"type": "boolean"},
        "bytes_written": _uint(), "bytes_read": _uint(), "keys_written": _uint(), "keys_read": _uint(),
        "query_num": _uint(),
    },
}

REGION_HEARTBEAT_SCHEMA: dict = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": f"opforge:pd/region-heartbeat/v{SCHEMA_VERSION}",
    "title": "RegionHeartbeat",
    "description": "What a region's leader reports; answered with the step to run now.",
    "type": "object",
    "required": ["region_id", "epoch", "peers", "leader_peer_id"],
    "properties": {
        "schema_version": {"const": SCHEMA_VERSION},
        "region_id": _uint(),
        "start_key": {**_HEX, "description": "hex; empty = -infinity"},
        "end_key": {**_HEX, "description": "hex; empty = +infinity; must sort after start_key"},
        "epoch": {"type": "object", "required": ["conf_ver", "version"],
                  "properties": {"conf_ver": _uint("bumped by membership changes"),
                                 "version": _uint("bumped by splits and merges")}},
        "peers": {"type": "array", "minItems": 1,
                  "description": "distinct peer ids on distinct stores",
                  "items": {"type": "object", "required": ["id", "store_id"],
                            "properties": {"id": _uint(), "store_id": _uint(),
                                           "role": {"enum": [r.value for r in PeerRole], "default": "voter"}}}},
        "leader_peer_id": {**_uint(), "description": "a voter among peers"},
        "approximate_size": _uint("MiB"),
        "approximate_keys": _uint(),
        "written_bytes": _uint(), "read_bytes": _uint(), "written_keys": _uint(), "read_keys": _uint(),
        "query_num": _uint(),
        "down_peers": {"type": "array", "items": _uint(), "description": "peer ids of the region"},
        "pending_peers": {"type": "array", "items": _uint(), "description": "peer ids of the region"},
    },
}

_STEP_SCHEMA = {
    "type": ["object", "null"],
    "description": "the step the leader should run now; 'kind' names it (TransferLeader, AddLearner, "
                   "PromoteLearner, RemovePeer, AddPeer, ChangePeerV2Enter, ChangePeerV2Leave, SplitRegion, "
                   "MergeRegion), the other fields are its arguments",
    "required": ["kind"],
    "properties": {"kind": {"type": "string"}},
}

REGION_HEARTBEAT_RESPONSE_SCHEMA: dict = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": f"opforge:pd/region-heartbeat-response/v{SCHEMA_VERSION}",
    "title": "RegionHeartbeatResponse",
    "type": "object",
    "required": ["region_id", "operator_id", "step"],
    "properties": {"region_id": _uint(), "operator_id": {"type": ["integer", "null"]}, "step": _STEP_SCHEMA},
}

REGION_HEARTBEAT_BATCH_SCHEMA: dict = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": f"opforge:pd/region-heartbeat-batch/v{SCHEMA_VERSION}",
    "title": "RegionHeartbeatBatch",
    "description": f"up to {MAX_BATCH} region heartbeats; answered with the steps of the regions that have one "
                   "and the refused heartbeats by index",
    "type": "object",
    "required": ["heartbeats"],
    "properties": {"heartbeats": {"type": "array", "maxItems": MAX_BATCH, "items": REGION_HEARTBEAT_SCHEMA}},
}


def heartbeat_schema() -> dict:
    return {
        "schema_version": SCHEMA_VERSION,
        "store_heartbeat": STORE_HEARTBEAT_SCHEMA,
        "region_heartbeat": REGION_HEARTBEAT_SCHEMA,
        "region_heartbeat_batch": REGION_HEARTBEAT_BATCH_SCHEMA,
        "region_heartbeat_response": REGION_HEARTBEAT_RESPONSE_SCHEMA,
    }


# --------------------------------------------------------------------------
# Errors and authentication
# --------------------------------------------------------------------------

class BadRequest(Exception):
    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


# What malformed input can raise while being parsed or applied. TypeError is
# here because parse_region_heartbeat lets some (unhashable peer ids in
# down_peers, for instance) escape as TypeError rather than HeartbeatError.
_INPUT_ERRORS = (HeartbeatError, ValueError, TypeError, KeyError)


def _digest(value: bytes) -> bytes:
    return hashlib.sha256(value).digest()


class BearerAuth:
    """Pure ASGI middleware: every HTTP request needs ``Authorization: Bearer <token>``."""

    def __init__(self, app, token: str):
        self.app = app
        self._expected = _digest(b"Bearer " + token.encode())

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            got = b""
            for k, v in scope["headers"]:
                if k == b"authorization":
                    got = v
                    break
            if not hmac.compare_digest(_digest(got), self._expected):
                body = json.dumps({"error": "missing or wrong bearer token" if got else
                                   "authorization required: send 'Authorization: Bearer <token>'"}).encode()
                await send({"type": "http.response.start", "status": 401,
                            "headers": [(b"content-type", b"application/json"),
                                        (b"content-length", str(len(body)).encode()),
                                        (b"www-authenticate", b'Bearer realm="opforge-pd"')]})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


# --------------------------------------------------------------------------
# The service state: driver, lock, storage, ticker
# --------------------------------------------------------------------------

class PDService:
    """Everything the endpoints share. Usable without HTTP (tests, benchmarks)."""

    def __init__(self, driver, storage: Storage | None = None, tick_interval: float = 1.0,
                 flush_interval: float = 0.5, load: bool = True):
        self.driver = driver
        self.storage = storage
        self.lock = threading.RLock()  # serializes every use of the driver (and the storage)
        self.tick_interval = tick_interval
        self.flush_interval = flush_interval
        self.started = time.time()
        self.ticks = 0
        self.tick_errors = 0
        self.last_tick_error = ""
        self.last_tick_ms = 0.0
        self.heartbeats = 0
        self.refused = 0  # heartbeats refused before they reached the driver (malformed)
        self.load_report = None
        self.scheduler_args: dict[str, dict] = {n: {} for n in driver.schedulers}
        if storage is not None and load:
            self.load_report = storage.load_into(driver)
            self.scheduler_args = dict(self.load_report.schedulers)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- background ticks --------------------------------------------------
    def start(self) -> None:
        if self._thread is not None or self.tick_interval <= 0:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run_ticks, name="pd-ticker", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        if self.storage is not None:
            with self.lock:
                self.storage.flush()

    def _run_ticks(self) -> None:
        next_tick = time.monotonic() + self.tick_interval
        next_flush = time.monotonic() + self.flush_interval
        while not self._stop.is_set():
            wait = min(next_tick, next_flush) - time.monotonic()
            if wait > 0 and self._stop.wait(wait):
                break
            now = time.monotonic()
            if now >= next_tick:
                self.tick_once()
                next_tick = max(next_tick + self.tick_interval, time.monotonic())
            if now >= next_flush:
                self.flush_once()
                next_flush = time.monotonic() + self.flush_interval

    def tick_once(self) -> list:
        t0 = time.perf_counter()
        try:
            with self.lock:
                ops = self.driver.tick()
            self.ticks += 1
            return ops
        except Exception as e:  # a scheduler bug must not stop the service
            self.tick_errors += 1
            self.last_tick_error = f"{type(e).__name__}: {e}"
            log.exception("placement driver tick failed")
            return []
        finally:
            self.last_tick_ms = (time.perf_counter() - t0) * 1e3

    def flush_once(self) -> None:
        if self.storage is None:
            return
        try:
            with self.lock:
                self.storage.flush()
        except Exception:
            log.exception("placement storage flush failed")

    # -- heartbeats --------------------------------------------------------
    def store_heartbeat(self, d: Any) -> dict:
        try:
            hb = parse_store_heartbeat(d)
        except HeartbeatError:
            self.refused += 1
            raise
        with self.lock:
            return self.driver.handle_store_heartbeat(hb)

    def region_heartbeat(self, d: Any) -> dict:
        try:
            hb = _parse_region(d, self.driver.cluster.regions)
        except HeartbeatError:
            self.refused += 1
            raise
        with self.lock:
            resp = self.driver.handle_region_heartbeat(hb)
            self.heartbeats += 1
        return resp.to_json()

    def region_heartbeats(self, items: list) -> dict:
        """A batch: every heartbeat parsed first (outside the lock), then
        applied in chunks under the lock. Only regions with a step, and the
        refused heartbeats, are answered."""
        with gc_paused:
            return self._region_heartbeats(items)

    def _region_heartbeats(self, items: list) -> dict:
        parsed = []
        errors = []
        regions = self.driver.cluster.regions
        fast = parse_known_region
        for i, d in enumerate(items):
            hb = fast(d, regions)
            if hb is not None:
                parsed.append((i, hb))
                continue
            try:
                parsed.append((i, _parse_region(d)))
            except HeartbeatError as e:
                errors.append({"index": i, "region_id": _rid(d), "error": str(e)})
        self.refused += len(errors)  # refused by the parser; the driver counts its own refusals
        steps = []
        handle = self.driver.handle_region_heartbeat
        accepted = 0
        for c in range(0, len(parsed), BATCH_LOCK_CHUNK):
            chunk = parsed[c:c + BATCH_LOCK_CHUNK]
            with self.lock:
                for i, hb in chunk:
                    try:
                        resp = handle(hb)
                    except HeartbeatError as e:
                        errors.append({"index": i, "region_id": hb.region.id, "error": str(e)})
                        continue
                    accepted += 1
                    if resp.step is not None:
                        steps.append(resp.to_json())
                self.heartbeats += len(chunk)
        if errors:
            errors.sort(key=lambda e: e["index"])
        return {"accepted": accepted, "refused": len(errors), "steps": steps, "errors": errors}

    # -- stores ------------------------------------------------------------
    def register_store(self, d: Any) -> dict:
        if not isinstance(d, dict):
            raise BadRequest(f"store must be a JSON object, got {type(d).__name__}")
        d = dict(d)
        if "store_id" not in d and "id" in d:
            d["store_id"] = d.pop("id")
        d.setdefault("capacity", 0)
        if isinstance(d["capacity"], int):
            d.setdefault("available", d["capacity"])
        store = parse_store_heartbeat(d).store
        if "state" in d and d["state"] != StoreState.UP.value:
            raise BadRequest("store: a store registers as 'up'; change its state with POST stores/{id}/state")
        with self.lock:
            self.driver.put_store(store)
            if self.storage is not None:
                self.storage.save_store(store, flush=True)
            return self._store_json(self.driver.cluster.get_store(store.id))

    def stores(self) -> dict:
        with self.lock:
            out = [self._store_json(s) for s in sorted(self.driver.cluster.stores.values(), key=lambda s: s.id)]
        return {"count": len(out), "stores": out}

    def store(self, store_id: int) -> dict:
        with self.lock:
            s = self.driver.cluster.get_store(store_id)
            if s is None:
                raise BadRequest(f"store {store_id} is not registered", 404)
            return self._store_json(s)

    def set_store_state(self, store_id: int, d: Any) -> dict:
        state = _require(d, "state", str, "store state")
        try:
            state = StoreState(state)
        except ValueError:
            raise BadRequest(f"store state: 'state' must be one of {[s.value for s in StoreState]}, "
                             f"got {state!r}") from None
        with self.lock:
            if self.driver.cluster.get_store(store_id) is None:
                raise BadRequest(f"store {store_id} is not registered", 404)
            self.driver.set_store_state(store_id, state)
            s = self.driver.cluster.get_store(store_id)
            if self.storage is not None:
                self.storage.save_store(s, flush=True)
            return self._store_json(s)

    def _store_json(self, s) -> dict:
        c = self.driver.cluster
        d = store_to_json(s)
        d.pop("schema_version", None)
        now = self.driver.clock()
        d.update(leader_count=c.leader_count(s.id), region_count=c.region_count(s.id),
                 leader_size=c.leader_size(s.id), region_size=c.region_size(s.id),
                 reported_region_count=s.region_count,
                 is_down=s.is_down(now, c.max_store_down_time),
                 last_heartbeat_age_s=round(max(now - s.last_heartbeat, 0.0), 3))
        return d

    # -- regions -----------------------------------------------------------
    def regions(self, offset: int = 0, limit: int = 100, store_id: int | None = None) -> dict:
        if offset < 0 or limit < 0:
            raise BadRequest("regions: offset and limit must be >= 0")
        limit = min(limit, MAX_PAGE)
        with self.lock:
            c = self.driver.cluster
            if store_id is None:
                total = len(c.regions)
                page = list(itertools.islice(c.regions.values(), offset, offset + limit))
            else:
                ids = sorted(c.region_ids_on(store_id))
                total = len(ids)
                page = [c.regions[i] for i in ids[offset:offset + limit] if i in c.regions]
            out = [self._region_json(r) for r in page]
        nxt = offset + len(page)
        return {"count": total, "offset": offset, "limit": limit, "regions": out,
                "next_offset": nxt if nxt < total else None}

    def region(self, region_id: int) -> dict:
        with self.lock:
            r = self.driver.cluster.regions.get(region_id)
            if r is None:
                raise BadRequest(f"region {region_id} is not known", 404)
            d = self._region_json(r)
            op = self.driver.controller.get(region_id)
            d["operator"] = op.to_json() if op is not None else None
            return d

    @staticmethod
    def _region_json(r) -> dict:
        d = region_to_json(r)
        d.pop("schema_version", None)
        d["leader_store_id"] = r.leader.store_id if r.leader else None
        return d

    # -- operators ---------------------------------------------------------
    def operators(self, history: int = 100) -> dict:
        with self.lock:
            ctl = self.driver.controller
            running = [op.to_json() for op in ctl.running()]
            waiting = [op.to_json() for op in ctl.waiting()]
            hist = _history(ctl, history)
            counts = ctl.counts_by_status()
        return {"running": running, "waiting": waiting, "history": hist, "counts": counts}

    def add_operator(self, d: Any) -> dict:
        kind = _require(d, "kind", str, "operator")
        rid = _require(d, "region_id", int, "operator")
        args = {}
        for name in ("to_store", "from_store"):
            if name in d:
                args[name] = _require(d, name, int, "operator")
        with self.lock:
            op = self.driver.add_operator(kind, rid, **args)
            d = op.to_json()
            # admitted, or queued behind a store limit (it starts when tokens refill)
            d["queued"] = self.driver.controller.get(rid) is not op
            if d["queued"]:
                d["queued_reason"] = self.driver.controller.last_refusal
            return d

    def remove_operator(self, region_id: int) -> dict:
        with self.lock:
            ctl = self.driver.controller
            op = ctl.get(region_id) or ctl.get_waiting(region_id)
            if op is None:
                raise BadRequest(f"region {region_id} has no running or waiting operator", 404)
            _cancel(ctl, op, self.driver.clock())
            return op.to_json()

    # -- schedulers --------------------------------------------------------
    def schedulers(self) -> dict:
        with self.lock:
            names = sorted(self.driver.schedulers)
            from opforge.placement import schedulers as registry
            available = _available_schedulers(registry)
        return {"schedulers": names, "args": {n: self.scheduler_args.get(n, {}) for n in names},
                "available": available}

    def add_scheduler(self, d: Any) -> dict:
        name = _require(d, "name", str, "scheduler")
        args = d.get("args") or {}
        if not isinstance(args, dict):
            raise BadRequest("scheduler: 'args' must be an object")
        with self.lock:
            try:
                self.driver.add_scheduler(name, **args)
            except KeyError as e:
                raise BadRequest(f"scheduler: unknown scheduler {name!r} ({e})") from None
            except TypeError as e:
                raise BadRequest(f"scheduler {name!r}: bad args: {e}") from None
            self.scheduler_args[name] = dict(args)
            self._save_schedulers()
        return self.schedulers()

    def remove_scheduler(self, name: str) -> dict:
        with self.lock:
            if name not in self.driver.schedulers:
                raise BadRequest(f"scheduler {name!r} is not running; running: {sorted(self.driver.schedulers)}",
                                 404)
            self.driver.remove_scheduler(name)
            self.scheduler_args.pop(name, None)
            self._save_schedulers()
        return self.schedulers()

    def _save_schedulers(self) -> None:
        if self.storage is not None:
            self.storage.save_schedulers({n: self.scheduler_args.get(n, {}) for n in self.driver.schedulers})

    # -- config and rules --------------------------------------------------
    def config(self) -> dict:
        with self.lock:
            return self.driver.config.to_json()

    def set_config(self, d: Any) -> dict:
        if not isinstance(d, dict) or not d:
            raise BadRequest("config: body must be a non-empty object {name: value, ...}")
        with self.lock:
            trial = copy.deepcopy(self.driver.config)
            for name, value in d.items():  # all or nothing: try every item on a copy first
                trial.set(name, value)
            for name, value in d.items():
                self.driver.set_config(name, value)
            if self.storage is not None:
                self.storage.save_config(self.driver.config.to_json())
            return self.driver.config.to_json()

    def rules(self) -> Any:
        with self.lock:
            return self.driver.rules.to_json()

    def set_rules(self, d: Any) -> Any:
        """Replace every rule and group (the form ``GET rules`` returns). The new
        manager is built and validated first: on error nothing changes."""
        with self.lock:
            restore_rules(self.driver, d)
            if self.storage is not None:
                self.storage.save_rules(self.driver.rules.to_json())
            return self.driver.rules.to_json()

    # -- health ------------------------------------------------------------
    def health(self) -> dict:
        with self.lock:
            c = self.driver.cluster
            d = {"status": "ok", "schema_version": SCHEMA_VERSION, "stores": len(c.stores),
                 "regions": len(c.regions), "running_operators": len(self.driver.controller.running()),
                 "schedulers": sorted(self.driver.schedulers)}
        d.update(uptime_s=round(time.time() - self.started, 3), ticks=self.ticks, tick_errors=self.tick_errors,
                 last_tick_ms=round(self.last_tick_ms, 3), last_tick_error=self.last_tick_error,
                 heartbeats=self.heartbeats, refused_heartbeats=self.refused + self.driver.errors,
                 storage=self.storage.path if self.storage is not None else None)
        return d


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
        if type(x) is not int or x < 0:
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


def _history(ctl, limit: int) -> list:
    """Ended operators, most recent first."""
    return [op.to_json() for op in ctl.history(limit)]


def _cancel(ctl, op, now: float) -> None:
    ctl.remove(op.region_id, reason="canceled by admin", now=now)


def _available_schedulers(registry) -> list[str]:
    return sorted(getattr(registry, "SCHEDULERS", {}))


# --------------------------------------------------------------------------
# The FastAPI app
# --------------------------------------------------------------------------

def create_app(driver, storage: Storage | None = None, *, token: str, tick_interval: float = 1.0,
               flush_interval: float = 0.5, close_storage: bool = False):
    """The ASGI app. ``storage`` (if given) is loaded into ``driver`` (which
    should be fresh) and then follows its changes. ``tick_interval <= 0``
    disables the background ticks (call ``app.state.pd.tick_once()``)."""
    if not token:
        raise ValueError("create_app needs a token: every request must carry 'Authorization: Bearer <token>'")
    svc = PDService(driver, storage, tick_interval=tick_interval, flush_interval=flush_interval)

    @asynccontextmanager
    async def lifespan(app):
        svc.start()
        try:
            yield
        finally:
            svc.stop()
            if storage is not None and close_storage:
                storage.close()

    app = FastAPI(title="opforge placement driver", version=str(SCHEMA_VERSION), lifespan=lifespan,
                  docs_url=None, redoc_url=None, openapi_url="/pd/api/v1/openapi.json")
    app.state.pd = svc
    app.add_middleware(BearerAuth, token=token)

    def _json(obj, status: int = 200) -> Response:
        return Response(json.dumps(obj, separators=(",", ":")).encode(), status_code=status,
                        media_type="application/json")

    def _error(status: int, message: str) -> Response:
        return _json({"error": message}, status)

    async def _body(request: Request):
        raw = await request.body()
        if not raw:
            raise BadRequest("request body is empty; send a JSON document")
        try:
            return json.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            raise BadRequest(f"request body is not valid JSON: {e}") from None

    async def _run(fn: Callable, *args, inline: bool = False):
        """Run ``fn`` (which takes the driver lock itself). Short calls run on
        the event loop when the lock is free; others in the thread pool so a
        long tick never stalls the loop."""
        if inline and svc.lock.acquire(blocking=False):  # re-entrant: fn takes it again
            try:
                return fn(*args)
            finally:
                svc.lock.release()
        return await run_in_threadpool(fn, *args)

    async def _handle(fn: Callable, *args, inline: bool = False) -> Response:
        try:
            return _json(await _run(fn, *args, inline=inline))
        except BadRequest as e:
            return _error(e.status, str(e))
        except _INPUT_ERRORS as e:
            return _error(400, str(e) if not isinstance(e, KeyError) else f"missing {e}")

    @app.exception_handler(BadRequest)
    async def _bad_request(request, exc: BadRequest):
        return _error(exc.status, str(exc))

    @app.exception_handler(RequestValidationError)
    async def _validation(request, exc: RequestValidationError):
        parts = []
        for err in exc.errors():
            loc = ".".join(str(x) for x in err.get("loc", ()) if x not in ("path", "query", "body"))
            parts.append(f"{loc}: {err.get('msg')}")
        return _error(400, "; ".join(parts) or "bad request")

    # -- heartbeats ----------------------------------------------------------
    @app.post(f"{API}/heartbeat/store")
    async def store_heartbeat(request: Request):
        return await _handle(svc.store_heartbeat, await _body(request), inline=True)

    @app.post(f"{API}/heartbeat/region")
    async def region_heartbeat(request: Request):
        return await _handle(svc.region_heartbeat, await _body(request), inline=True)

    @app.post(f"{API}/heartbeat/regions")
    async def region_heartbeats(request: Request):
        raw = await request.body()

        def work():
            with gc_paused:
                try:
                    d = json.loads(raw)
                except (ValueError, UnicodeDecodeError) as e:
                    raise BadRequest(f"request body is not valid JSON: {e}") from None
                items = d.get("heartbeats") if isinstance(d, dict) else d
                if not isinstance(items, list):
                    raise BadRequest("region heartbeat batch: field 'heartbeats' must be a list")
                if len(items) > MAX_BATCH:
                    raise BadRequest(f"region heartbeat batch: at most {MAX_BATCH} heartbeats, got {len(items)}",
                                     413)
                try:
                    return svc.region_heartbeats(items)
                finally:
                    del d, items  # freed here, while the collector is still paused

        return await _handle(work)

    # -- stores --------------------------------------------------------------
    @app.post(f"{API}/stores")
    async def register_store(request: Request):
        return await _handle(svc.register_store, await _body(request))

    @app.get(f"{API}/stores")
    async def list_stores():
        return await _handle(svc.stores)

    @app.get(f"{API}/stores/{{store_id}}")
    async def get_store(store_id: int):
        return await _handle(svc.store, store_id)

    @app.post(f"{API}/stores/{{store_id}}/state")
    async def store_state(store_id: int, request: Request):
        return await _handle(svc.set_store_state, store_id, await _body(request))

    # -- regions -------------------------------------------------------------
    @app.get(f"{API}/regions")
    async def list_regions(offset: int = 0, limit: int = 100, store_id: int | None = None):
        return await _handle(svc.regions, offset, limit, store_id)

    @app.get(f"{API}/regions/{{region_id}}")
    async def get_region(region_id: int):
        return await _handle(svc.region, region_id)

    # -- operators -----------------------------------------------------------
    @app.get(f"{API}/operators")
    async def list_operators(history: int = 100):
        return await _handle(svc.operators, history)

    @app.post(f"{API}/operators")
    async def add_operator(request: Request):
        return await _handle(svc.add_operator, await _body(request))

    @app.delete(f"{API}/operators/{{region_id}}")
    async def remove_operator(region_id: int):
        return await _handle(svc.remove_operator, region_id)

    # -- schedulers ----------------------------------------------------------
    @app.get(f"{API}/schedulers")
    async def list_schedulers():
        return await _handle(svc.schedulers)

    @app.post(f"{API}/schedulers")
    async def add_scheduler(request: Request):
        return await _handle(svc.add_scheduler, await _body(request))

    @app.delete(f"{API}/schedulers/{{name}}")
    async def remove_scheduler(name: str):
        return await _handle(svc.remove_scheduler, name)

    # -- config and rules ----------------------------------------------------
    @app.get(f"{API}/config")
    async def get_config():
        return await _handle(svc.config)

    @app.put(f"{API}/config")
    async def put_config(request: Request):
        return await _handle(svc.set_config, await _body(request))

    @app.get(f"{API}/rules")
    async def get_rules():
        return await _handle(svc.rules)

    @app.put(f"{API}/rules")
    async def put_rules(request: Request):
        return await _handle(svc.set_rules, await _body(request))

    # -- schema and health ---------------------------------------------------
    @app.get(f"{API}/schema/heartbeat")
    async def schema():
        return _json(heartbeat_schema())

    @app.get(f"{API}/health")
    async def health():
        return await _handle(svc.health)

    return app


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve(host: str = "127.0.0.1", port: int = 2379, token: str | None = None, db: str | None = None,
          tick_interval: float = 1.0, log_level: str = "info", driver=None) -> None:
    """Run the service with uvicorn until interrupted. ``token`` defaults to
    ``$OPFORGE_PD_TOKEN``; there is no default token (refuses to start
    without one). ``db``: the SQLite file (None: nothing is persisted)."""
    token = token or os.environ.get("OPFORGE_PD_TOKEN")
    if not token:
        raise SystemExit("opforge pd serve: refusing to start without a token; pass --token or set "
                         "OPFORGE_PD_TOKEN")
    import uvicorn

    if not _is_loopback(host):
        log.warning("placement driver listening on %s (not loopback): anyone who can reach it and holds the "
                    "token can change the cluster; put TLS in front of it", host)
    if driver is None:
        from opforge.placement.driver import Driver

        driver = Driver()
    storage = Storage(db) if db else None
    if storage is None:
        log.warning("placement driver: no --db given; nothing will be persisted")
    app = create_app(driver, storage, token=token, tick_interval=tick_interval, close_storage=True)
    if storage is not None and app.state.pd.load_report is not None:
        log.info("placement driver: loaded %s from %s", app.state.pd.load_report.to_json(), db)
    uvicorn.run(app, host=host, port=port, log_level=log_level)

"""``PDService``: the service's state (driver, lock, storage, background
ticker) and every operation the routes expose, usable without HTTP (tests,
benchmarks)."""

from __future__ import annotations

import copy
import itertools
import logging
import threading
import time
from typing import Any

from opforge.placement.cluster import StoreState
from opforge.placement.heartbeat import SCHEMA_VERSION, HeartbeatError, parse_store_heartbeat
from opforge.placement.service.errors import BadRequest
from opforge.placement.service.parsing import _parse_region, _require, _rid, gc_paused, parse_known_region
from opforge.placement.service.schema import MAX_PAGE
from opforge.placement.storage import Storage, region_to_json, restore_rules, store_to_json

log = logging.getLogger(__name__)

BATCH_LOCK_CHUNK = 4096  # heartbeats applied per lock hold, so ticks and admins interleave


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
            old = self.driver.cluster.get_store(store.id)
            self.driver.put_store(store)
            if self.storage is not None:
                self.storage.save_store(store, flush=True)
                failed = [f for f in self.storage.failed if f[0] == "store" and f[1] == store.id]
                if failed:  # not acknowledged, so not kept: the driver is as it was
                    self.storage.discard_store(store.id)
                    if old is None:
                        self.driver.cluster.forget_store(store.id)
                    else:
                        self.driver.cluster.put_store(old)
                        self.storage.discard_store(store.id)
                    raise BadRequest(f"store {store.id}: could not be saved ({failed[0][2]}); not registered", 500)
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
            trial.validate()
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


def _history(ctl, limit: int) -> list:
    """Ended operators, most recent first."""
    return [op.to_json() for op in ctl.history(limit)]


def _cancel(ctl, op, now: float) -> None:
    ctl.remove(op.region_id, reason="canceled by admin", now=now)


def _available_schedulers(registry) -> list[str]:
    return sorted(getattr(registry, "SCHEDULERS", {}))

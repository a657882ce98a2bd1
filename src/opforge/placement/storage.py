"""Persistence of the placement driver's metadata in SQLite (WAL).

What a restarted service needs so that it loses nothing: stores (with their
administrative state), regions, placement rules, the schedule config, the
running schedulers (with their arguments), and the peer-id high-water mark
(so no peer id handed to a worker is ever handed out again: the file holds a
reservation ``PEER_ID_RESERVE`` ahead of the allocator, as PD's id allocator
does, see ``Storage._reserve_peer_ids``).

Everything is JSON in TEXT columns -- no pickle. Stores and regions are
written in their heartbeat wire form (``heartbeat.*.to_json``) and read back
through a quick decoder for rows in exactly that form, else through
``parse_*``; a damaged row is refused with its id named (``StorageError``).

Region heartbeats can arrive at 10^5 per second, so regions are written in
batches: ``save_region`` only notes the region (and only when its metadata --
epoch, leader -- changed since it was last written, a tuple compare);
``flush`` writes every noted region, store, deletion and setting in one
transaction. ``save_region`` flushes by itself once ``batch_size`` regions
wait; the service flushes every ``flush_interval`` (0.5 s) and at shutdown.
A crash can lose at most the last unflushed window, which the workers report
again with their next heartbeats.

Flow statistics (bytes written/read per interval) are not history worth
keeping: a region whose epoch and leader are unchanged is not rewritten, even
if its size or flow changed. Sizes written are those of the last metadata
change; the next heartbeat after a restart brings them up to date.

``attach(driver)`` (done by ``load_into``) makes the storage follow every
change to the driver's cluster (region puts and removals, store puts), so
regions that a split or merge replaces are deleted from the file as well.
Administrative state that does not go through the cluster (store state,
config, rules, schedulers) is saved by the service with ``save_*``.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from opforge.placement.cluster import Peer, PeerRole, Region, RegionEpoch, Store
from opforge.placement.heartbeat import MAX_UINT64 as _MAX_UINT64
from opforge.placement.heartbeat import SCHEMA_VERSION, HeartbeatError, RegionHeartbeat, StoreHeartbeat, \
    parse_region_heartbeat, parse_store_heartbeat

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
PEER_ID_RESERVE = 100_000  # peer ids reserved ahead in the file (see Storage._reserve_peer_ids)

def sql_id(i: int) -> int:
    """An id (unsigned 64-bit, as PD's) as SQLite's signed 64-bit INTEGER:
    ids from 2^63 on are stored as ``id - 2^64`` (two's complement), so the
    whole range round-trips; ``from_sql_id`` reverses it."""
    if not 0 <= i <= _MAX_UINT64:
        raise OverflowError(f"id {i} is not an unsigned 64-bit integer")
    return i - (1 << 64) if i >= 1 << 63 else i


def from_sql_id(i: int) -> int:
    return i + (1 << 64) if i < 0 else i


_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS stores (id INTEGER PRIMARY KEY, data TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS regions (id INTEGER PRIMARY KEY, data TEXT NOT NULL);
"""


class StorageError(RuntimeError):
    """The database cannot be used (wrong format, damaged rows)."""


@dataclass
class LoadReport:
    """What ``load_into`` restored."""

    stores: int = 0
    regions: int = 0
    config_items: int = 0
    rules: bool = False
    schedulers: dict[str, dict] = field(default_factory=dict)  # name -> args
    peer_id_hwm: int = 0
    seconds: float = 0.0

    def to_json(self) -> dict:
        return {"stores": self.stores, "regions": self.regions, "config_items": self.config_items,
                "rules": self.rules, "schedulers": sorted(self.schedulers), "peer_id_hwm": self.peer_id_hwm,
                "seconds": round(self.seconds, 3)}


def region_to_json(r: Region) -> dict[str, Any]:
    return RegionHeartbeat(r).to_json()


def store_to_json(s: Store) -> dict[str, Any]:
    return StoreHeartbeat(s).to_json()


def peek_next_peer_id(ids) -> int:
    """The next id a ``builder.PeerIds`` will hand out, without taking it."""
    return ids.peek()


class Storage:
    """SQLite-backed metadata of one placement driver.

    Thread-safe: one connection, guarded by a lock. The service calls it while
    holding the driver lock anyway.
    """

    def __init__(self, path: str | os.PathLike, batch_size: int = 8192, flush_interval: float = 0.5):
        self.path = os.fspath(path)
        self.batch_size = batch_size
        self.flush_interval = flush_interval
        self._lock = threading.RLock()
        d = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(d, exist_ok=True)
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        fmt = self._get_meta("format_version")
        if fmt is None:
            self._set_meta_now("format_version", FORMAT_VERSION)
        elif fmt != FORMAT_VERSION:
            raise StorageError(f"{self.path}: storage format {fmt!r} is not supported (this build writes "
                               f"{FORMAT_VERSION})")
        self._pending_regions: dict[int, Region] = {}
        self._deleted_regions: set[int] = set()
        self._pending_stores: dict[int, Store] = {}
        self._pending_meta: dict[str, Any] = {}
        # region id -> (conf_ver, version, leader peer id) last written
        self._written: dict[int, tuple] = {}
        self._last_flush = time.monotonic()
        self._driver = None
        self._hwm_cache: int | None = None
        self.flushes = 0
        self.regions_written = 0
        self.dropped = 0  # items refused for their data at a flush (logged)
        self.failed: list[tuple[str, Any, str]] = []  # items the last flush did not write
        self.closed = False

    # -- writing ---------------------------------------------------------
    def save_store(self, store: Store, flush: bool = False) -> None:
        with self._lock:
            self._pending_stores[store.id] = store
            if flush:
                self.flush()

    def save_region(self, region: Region) -> None:
        """Note a region for the next batch, if its metadata changed since last written."""
        leader = region.leader
        e = region.epoch
        fp = (e.conf_ver, e.version, leader.id if leader is not None else None)
        if self._written.get(region.id) == fp:
            return
        with self._lock:
            self._written[region.id] = fp
            self._pending_regions[region.id] = region
            self._deleted_regions.discard(region.id)
            if len(self._pending_regions) >= self.batch_size:
                self.flush()

    def save_regions(self, regions) -> None:
        for r in regions:
            self.save_region(r)

    def delete_region(self, region_id: int) -> None:
        with self._lock:
            self._pending_regions.pop(region_id, None)
            self._written.pop(region_id, None)
            self._deleted_regions.add(region_id)

    def save_config(self, config_json: dict, flush: bool = True) -> None:
        self._save_meta("config", config_json, flush)

    def save_rules(self, rules_json: Any, flush: bool = True) -> None:
        self._save_meta("rules", rules_json, flush)

    def save_schedulers(self, specs: dict[str, dict], flush: bool = True) -> None:
        """``specs``: the running schedulers, name -> the arguments they were added with."""
        self._save_meta("schedulers", {n: dict(a or {}) for n, a in specs.items()}, flush)

    def save_peer_id_hwm(self, hwm: int, flush: bool = False) -> None:
        self._save_meta("peer_id_hwm", int(hwm), flush)

    def _save_meta(self, key: str, value: Any, flush: bool) -> None:
        json.dumps(value)  # refuse what cannot be stored now, not at flush time
        with self._lock:
            self._pending_meta[key] = value
            if flush:
                self.flush()

    def maybe_flush(self) -> None:
        """Flush if something waits and ``flush_interval`` has passed."""
        if (self._pending_regions or self._pending_stores or self._deleted_regions or self._pending_meta) and \
                time.monotonic() - self._last_flush >= self.flush_interval:
            self.flush()

    def flush(self) -> int:
        """Write everything waiting in one transaction; returns the rows written.

        An item that cannot be written never takes others with it: when the
        transaction fails, every item is written on its own. One refused for
        its data (an id no SQLite row can hold, ...) is dropped and logged; one
        refused by the database itself (disk full, locked) waits for the next
        flush. ``failed`` lists the items of the last flush that were not
        written: ``(kind, id, error)``, kind ``"region"``, ``"deleted"``,
        ``"store"`` or ``"meta"``."""
        with self._lock:
            self.failed = []
            if self.closed:
                return 0
            if self._driver is not None:
                self._reserve_peer_ids()
            regions, self._pending_regions = self._pending_regions, {}
            deleted, self._deleted_regions = self._deleted_regions, set()
            stores, self._pending_stores = self._pending_stores, {}
            meta, self._pending_meta = self._pending_meta, {}
            self._last_flush = time.monotonic()
            if not (regions or deleted or stores or meta):
                return 0
            items = {"region": self._rows(regions, region_to_json, "region"),
                     "deleted": self._rows(dict.fromkeys(deleted), None, "deleted"),
                     "store": self._rows(stores, store_to_json, "store"),
                     "meta": [(k, (k, json.dumps(v))) for k, v in meta.items()]}
            try:
                self._transaction({k: [row for _, row in v] for k, v in items.items()})
                written = items
            except Exception as e:  # noqa: BLE001 -- any failure: fall back to one item at a time
                log.warning("storage %s: a flush of %d items failed (%s: %s); writing them one by one", self.path,
                            sum(map(len, items.values())), type(e).__name__, e)
                written = self._one_by_one(items, regions, deleted, stores, meta)
            if any(k == "peer_id_hwm" for k, _ in written["meta"]):
                self._hwm_cache = meta["peer_id_hwm"]
            self.flushes += 1
            self.regions_written += len(written["region"])
            return sum(map(len, written.values()))

    def _rows(self, objs: dict, to_json, kind: str) -> list[tuple[int, tuple]]:
        """``(id, row)`` for each object; what no row can hold is dropped (logged, in ``failed``)."""
        dumps = json.dumps
        rows = []
        for oid, obj in objs.items():
            try:
                row = (sql_id(oid),) if to_json is None else (sql_id(oid), dumps(to_json(obj), separators=(",", ":")))
            except (OverflowError, ValueError, TypeError) as e:
                self._drop(kind, oid, e)
                continue
            rows.append((oid, row))
        return rows

    def _drop(self, kind: str, oid, error: BaseException) -> None:
        self.failed.append((kind, oid, f"{type(error).__name__}: {error}"))
        self.dropped += 1
        log.error("storage %s: %s %s not written, dropped: %s: %s", self.path, kind, oid, type(error).__name__, error)

    def _one_by_one(self, items: dict, regions: dict, deleted: set, stores: dict, meta: dict) -> dict:
        written: dict[str, list] = {k: [] for k in items}
        for kind, rows in items.items():
            for oid, row in rows:
                try:
                    self._transaction({kind: [row]})
                    written[kind].append((oid, row))
                except (sqlite3.OperationalError, OSError) as e:  # the database, not the item: try again later
                    self.failed.append((kind, oid, f"{type(e).__name__}: {e}"))
                    log.error("storage %s: %s %s not written, kept for the next flush: %s: %s", self.path, kind,
                              oid, type(e).__name__, e)
                    if kind == "region":
                        self._pending_regions.setdefault(oid, regions[oid])
                    elif kind == "deleted" and oid not in self._pending_regions:
                        self._deleted_regions.add(oid)
                    elif kind == "store":
                        self._pending_stores.setdefault(oid, stores[oid])
                    elif kind == "meta":
                        self._pending_meta.setdefault(oid, meta[oid])
                except Exception as e:  # noqa: BLE001 -- this item's data: drop it alone
                    self._drop(kind, oid, e)
        return written

    def _transaction(self, rows: dict[str, list]) -> None:
        cur = self._db.cursor()
        cur.execute("BEGIN")
        try:
            if rows.get("region"):
                cur.executemany("INSERT OR REPLACE INTO regions (id, data) VALUES (?, ?)", rows["region"])
            if rows.get("deleted"):
                cur.executemany("DELETE FROM regions WHERE id = ?", rows["deleted"])
            if rows.get("store"):
                self._write_stores(cur, rows["store"])
            if rows.get("meta"):
                cur.executemany("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", rows["meta"])
            cur.execute("COMMIT")
        except BaseException:
            cur.execute("ROLLBACK")
            raise

    @staticmethod
    def _write_stores(cur, rows: list) -> None:
        cur.executemany("INSERT OR REPLACE INTO stores (id, data) VALUES (?, ?)", rows)

    def discard_store(self, store_id: int) -> None:
        """Forget a store's unwritten change (the service rolls back a registration it could not save)."""
        with self._lock:
            self._pending_stores.pop(store_id, None)

    def _reserve_peer_ids(self) -> None:
        """Keep the stored high-water mark ahead of the ids the driver hands out.

        Like PD's id allocator, the file holds a *reservation*: every id at or
        below it may have been handed out. It is moved ``PEER_ID_RESERVE`` past
        the next id whenever fewer than half of that remain, so a crash between
        two flushes (0.5 s apart; operators are limited to a few thousand) can
        never lead a restarted driver to hand out an id it already gave a worker."""
        nxt = peek_next_peer_id(self._driver.ids)
        if self._hwm_cache is None or nxt > self._hwm_cache - PEER_ID_RESERVE // 2:
            self._pending_meta["peer_id_hwm"] = nxt + PEER_ID_RESERVE

    def _get_meta(self, key: str) -> Any:
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else json.loads(row[0])

    def _set_meta_now(self, key: str, value: Any) -> None:
        self._db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, json.dumps(value)))

    def close(self) -> None:
        with self._lock:
            if self.closed:
                return
            self.detach()
            self.flush()
            self.closed = True
            self._db.close()

    # -- following a driver ----------------------------------------------
    def attach(self, driver) -> None:
        """Follow every change to ``driver.cluster``: region puts are batched,
        removals (regions a split or merge replaced) deleted, stores saved."""
        if self._driver is not None:
            self.detach()
        cluster = driver.cluster
        put_region, remove_region, put_store = cluster.put_region, cluster.remove_region, cluster.put_store
        save_region, delete_region, save_store = self.save_region, self.delete_region, self.save_store

        def _put_region(region):
            put_region(region)
            save_region(region)

        def _remove_region(region_id):
            remove_region(region_id)
            delete_region(region_id)

        def _put_store(store):
            put_store(store)
            save_store(store)

        cluster.put_region, cluster.remove_region, cluster.put_store = _put_region, _remove_region, _put_store
        self._driver = driver
        self._originals = (cluster, put_region, remove_region, put_store)

    def detach(self) -> None:
        if self._driver is None:
            return
        cluster = self._originals[0]
        for name in ("put_region", "remove_region", "put_store"):
            cluster.__dict__.pop(name, None)
        self._driver = None

    # -- reading ---------------------------------------------------------
    def counts(self) -> dict[str, int]:
        with self._lock:
            return {t: self._db.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in ("stores", "regions")}

    def load_config(self) -> dict | None:
        with self._lock:
            return self._get_meta("config")

    def load_rules(self) -> Any:
        with self._lock:
            return self._get_meta("rules")

    def load_schedulers(self) -> dict[str, dict] | None:
        with self._lock:
            return self._get_meta("schedulers")

    def load_into(self, driver, attach: bool = True) -> LoadReport:
        """Restore everything saved into ``driver`` (a fresh one), then (by
        default) follow its changes from now on."""
        t0 = time.perf_counter()
        rep = LoadReport()
        with self._lock:
            # config first: the cluster's down time and the rules depend on it
            cfg = self._get_meta("config")
            if cfg:
                for name, value in cfg.items():
                    try:
                        driver.set_config(name, value)
                        rep.config_items += 1
                    except ValueError as e:  # an item this build no longer knows
                        log.warning("storage %s: config item %s not restored: %s", self.path, name, e)
            rules = self._get_meta("rules")
            if rules is not None:
                restore_rules(driver, rules)
                rep.rules = True
            specs = self._get_meta("schedulers")
            if specs is not None:
                for name in list(driver.schedulers):
                    if name not in specs:
                        driver.remove_scheduler(name)
                for name, args in specs.items():
                    if name not in driver.schedulers:
                        try:
                            driver.add_scheduler(name, **(args or {}))
                        except (ValueError, KeyError, TypeError) as e:
                            log.warning("storage %s: scheduler %s not restored: %s", self.path, name, e)
                            continue
                rep.schedulers = {n: dict(specs.get(n) or {}) for n in driver.schedulers}
            else:
                rep.schedulers = {n: {} for n in driver.schedulers}
            # stores: kept with their administrative state; counted as just heard
            # from (as PD does after a restart) so they are not down at once.
            now = driver.clock()
            for sid, data in self._db.execute("SELECT id, data FROM stores"):
                sid = from_sql_id(sid)
                try:
                    store = parse_store_heartbeat(json.loads(data)).store
                except (HeartbeatError, ValueError) as e:
                    raise StorageError(f"{self.path}: stores row {sid} is damaged: {e}") from None
                if store.id != sid:
                    raise StorageError(f"{self.path}: stores row {sid} holds store {store.id}")
                store.last_heartbeat = now
                driver.cluster.put_store(store)
                rep.stores += 1
            regions = []
            max_peer = 0
            loads = json.loads
            for rid, data in self._db.execute("SELECT id, data FROM regions"):
                rid = from_sql_id(rid)
                try:
                    d = loads(data)
                    r = _stored_region(d)
                    if r is None:  # not in the form this module writes: the full parser decides
                        r = parse_region_heartbeat(d).region
                except (HeartbeatError, ValueError) as e:
                    raise StorageError(f"{self.path}: regions row {rid} is damaged: {e}") from None
                if r.id != rid:
                    raise StorageError(f"{self.path}: regions row {rid} holds region {r.id}")
                regions.append(r)
            # in key order, so the cluster's sorted start-key index only appends
            regions.sort(key=lambda r: r.start_key)
            put = driver.cluster.put_region
            written = self._written
            for r in regions:
                put(r)
                written[r.id] = (r.epoch.conf_ver, r.epoch.version, r.leader.id if r.leader else None)
                for p in r.peers:
                    if p.id > max_peer:
                        max_peer = p.id
            rep.regions = len(regions)
            hwm = self._get_meta("peer_id_hwm") or 0
            hwm = max(int(hwm), max_peer)
            if hwm:
                driver.ids.advance_past(hwm)
            rep.peer_id_hwm = hwm
            # reserve ahead at once: ids handed out before the first flush are covered too
            nxt = peek_next_peer_id(driver.ids)
            self._set_meta_now("peer_id_hwm", nxt + PEER_ID_RESERVE)
            self._hwm_cache = nxt + PEER_ID_RESERVE
        if attach:
            self.attach(driver)
        rep.seconds = time.perf_counter() - t0
        return rep


_ROLES = {r.value: r for r in PeerRole}
_INT_FIELDS = ("region_id", "approximate_size", "approximate_keys", "written_bytes", "read_bytes", "written_keys",
               "read_keys", "query_num")


def _stored_region(d: Any) -> Region | None:
    """A region row as ``region_to_json`` wrote it, rebuilt without the wire
    parser's field-by-field checks (3-4x faster on a million-region restart).
    Returns None for anything not exactly in that form; the caller then runs
    ``parse_region_heartbeat``, which accepts or words the error."""
    try:
        if d.get("schema_version") != SCHEMA_VERSION or d.get("down_peers") or d.get("pending_peers"):
            return None
        for name in _INT_FIELDS:
            v = d[name]
            if type(v) is not int or v < 0 or v > _MAX_UINT64:
                return None
        e = d["epoch"]
        cv, ver = e["conf_ver"], e["version"]
        if type(cv) is not int or type(ver) is not int or not (0 <= cv <= _MAX_UINT64 and 0 <= ver <= _MAX_UINT64):
            return None
        peers = []
        stores = set()
        for p in d["peers"]:
            pid, sid = p["id"], p["store_id"]
            if type(pid) is not int or type(sid) is not int or sid in stores \
                    or not (0 <= pid <= _MAX_UINT64 and 0 <= sid <= _MAX_UINT64):
                return None
            stores.add(sid)
            peers.append(Peer(pid, sid, _ROLES[p["role"]]))
        lid = d["leader_peer_id"]
        leader = next((p for p in peers if p.id == lid), None)
        if leader is None or not leader.is_voter or len({p.id for p in peers}) != len(peers):
            return None
        start, end = bytes.fromhex(d["start_key"]), bytes.fromhex(d["end_key"])
        if end and start >= end:
            return None
        return Region(id=d["region_id"], start_key=start, end_key=end, epoch=RegionEpoch(cv, ver),
                      peers=tuple(peers), leader=leader, approximate_size=d["approximate_size"],
                      approximate_keys=d["approximate_keys"], written_bytes=d["written_bytes"],
                      read_bytes=d["read_bytes"], written_keys=d["written_keys"], read_keys=d["read_keys"],
                      query_num=d["query_num"])
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def rules_to_json(driver) -> Any:
    return driver.rules.to_json()


def restore_rules(driver, data: Any) -> None:
    """Replace ``driver.rules`` by the rules in ``data`` (``RuleManager.to_json``
    form). The new manager is built and validated before it replaces the old
    one, so a bad document changes nothing (ValueError)."""
    from opforge.placement.rules import RuleManager

    driver.rules = RuleManager.from_json(data, driver.config)


__all__ = ["Storage", "StorageError", "sql_id", "from_sql_id", "LoadReport", "peek_next_peer_id", "region_to_json",
           "store_to_json",
           "restore_rules", "rules_to_json"]

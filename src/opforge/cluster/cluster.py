"""The coordinator of a cluster of workers: Ray for control, a process group for data, the
placement driver for where regions live.

``start(address=None, workers=N)`` embeds a local Ray instance (or attaches to ``address``), starts
the placement-driver service in this process, and one long-lived ``Worker`` actor per GPU (per CPU
process without GPUs). Ray restarts an actor that dies (``max_restarts``); the coordinator notices
the new process, marks the old store offline, drops its replicas from the regions (a surviving
replica leads where the dead one led: what a Raft election would do), re-forms the process group,
and registers the new process as a new, empty store. The driver's rule checker then adds the
missing replicas; the
operator steps it sends back in heartbeat answers are run here, between queries, by telling the
leader to send a snapshot and the target to receive it over the group (``Worker.send_region``).

A query is planned by the caller (``sql.connect(cluster=c)``) and run by every worker on the
regions it leads (``Worker.run_query``); a worker dying mid-query makes it fail with
:class:`~opforge.cluster.errors.RetryableError`, and the next call recovers first. A worker whose
call raises alone (its peers waiting for it in a collective) fails the call within seconds, not at
the group's timeout: the failed worker leaves the group, the peers are aborted, and its error comes
back naming it (``_collect``); a peer still stuck at the next call is killed and restarted.
"""
from __future__ import annotations

import itertools
import os
import signal
import tempfile
import time

import pyarrow as pa

from opforge.cluster import endpoint
from opforge.cluster import regions as R
from opforge.cluster.errors import ClusterError, RetryableError
from opforge.cluster import pd_service
from opforge.cluster.pd_service import PDServer
from opforge.cluster.worker import Worker
from opforge.distributed.errors import CollectiveError

GROUP_TIMEOUT_S = 60.0
# After one worker's call failed: how long its peers get to fail too (they are told to leave the
# collective they wait in) before the error goes back without them.
ABORT_GRACE_S = 3.0
# ``recover``: how long a worker still in a failed call may take to end it before it is killed
# (and restarted by Ray, a lost store: its replicas are made again from the others).
STRAGGLER_WAIT_S = 15.0


def _ray():
    import ray

    return ray


class Cluster:
    def __init__(self, workers: int, *, replicas: int = 2, regions_per_table: int | None = None,
                 backend: str | None = None, owns_ray: bool = False, pd_host: str = "127.0.0.1",
                 group_timeout: float = GROUP_TIMEOUT_S, max_restarts: int = 4, hot_bytes: float | None = None):
        if workers < 1:
            raise ValueError(f"opforge.cluster.start: workers must be >= 1, got {workers}")
        ray = _ray()
        self.replicas = min(replicas, workers)
        self.regions_per_table = regions_per_table or 2 * workers
        self.group_timeout = group_timeout
        self._owns_ray = owns_ray
        self.pd = PDServer(self.replicas, pd_host, hot_bytes).start()  # hot_bytes: pd_service.make_driver
        gpus = ray.cluster_resources().get("GPU", 0) >= workers and backend != "gloo"
        opts = {"num_gpus": 1} if gpus else {"num_cpus": 1}
        # "control": a second thread per worker, so the coordinator can abort a group while the
        # worker's task is blocked in one of its collectives (``_abort_peers``)
        self._actor = ray.remote(concurrency_groups={"control": 1})(Worker).options(
            max_restarts=max_restarts, max_task_retries=0, **opts)
        self.backend = backend or ("nccl" if gpus else "gloo")
        self.workers = [self._new_worker(i) for i in range(workers)]
        self._worker_names = itertools.count(workers)  # a worker's name (its store's label) is never reused
        self.store_of: list[int] = [0] * workers  # worker index -> its current store id
        self.pids: list[int] = [0] * workers
        self.devices: list[str] = [""] * workers  # where each worker computes ("cuda:0", "cpu")
        self.dead_stores: set[int] = set()
        self.draining: set[int] = set()  # stores marked offline by remove_worker, their regions moving away
        self._store_ids = itertools.count(1)
        self._peer_ids = itertools.count(1)
        self._table_ids = itertools.count(1)
        self.tables: dict[str, dict] = {}  # name -> {"id", "regions": [region ids], "partition_by"}
        self.regions: dict[int, R.RegionMeta] = {}
        self._region_ids = itertools.count(1)
        self.steps_run = 0
        self.splits = 0
        self.last_query: dict = {}
        self._suspect = False
        self._stragglers: list[tuple] = []  # (worker actor, its call's ref): still in a call that failed
        self._aborts: list = []  # refs of the leave / abort calls _abort_peers sent
        self._stopped = False
        infos = ray.get([w.info.remote() for w in self.workers])
        for i, info in enumerate(infos):
            self._make_store(i, info)
        self._form_group()
        self._publish()

    def _publish(self) -> None:
        """The endpoint file ``opforge cluster status`` reads (``endpoint.py``)."""
        endpoint.write(self.pd.url, self.pd.token, {n: t["id"] for n, t in self.tables.items()})

    # -- membership ---------------------------------------------------------------------------------
    @property
    def size(self) -> int:
        return len(self.workers)

    def _new_worker(self, i: int):
        return self._actor.remote(i, self.pd.url, self.pd.token, self.backend)

    def add_worker(self) -> int:
        """Scale out: one more worker, a new empty store; the group is re-formed with it, and the
        balance schedulers move regions to it over the next heartbeat rounds (``settle()``).
        Ray must have room for one more actor (a CPU, or a GPU). Returns its index."""
        self._ensure_ready()
        i = self.size
        self.workers.append(self._new_worker(next(self._worker_names)))
        self.store_of.append(0)
        self.pids.append(0)
        self.devices.append("")
        self._make_store(i, _ray().get(self.workers[i].info.remote()))
        self._form_group()
        return i

    def drain(self, i: int) -> int:
        """Start removing worker ``i``: its store goes offline in the driver (PD's first state of a
        removal), so the rule checker moves its replicas and leaders to the other stores over the
        next heartbeat rounds while the worker still serves. Returns the store id."""
        self._ensure_ready()
        if not 0 <= i < self.size:
            raise ValueError(f"opforge.cluster: no worker {i} (the cluster has {self.size})")
        sid = self.store_of[i]
        if sid in self.draining:
            return sid
        if self.size - len(self.draining) - 1 < self.replicas:
            raise ValueError(f"opforge.cluster: removing worker {i} would leave fewer workers than the "
                             f"{self.replicas} replicas each region keeps")
        self.pd.service.set_store_state(sid, {"state": "offline"})
        self.draining.add(sid)
        return sid

    def remove_worker(self, i: int, max_rounds: int = 200) -> int:
        """Scale in: drain worker ``i`` (:meth:`drain`) and run heartbeat rounds until the driver has
        moved every replica off it and made its store a tombstone; the round that sees it then
        stops the actor and re-forms the group without it (``_retire_drained``; the workers after it
        move down one index). Queries run correctly throughout. Returns the removed store id.
        A store taken offline from outside (``opforge pd ctl store delete ID``) goes the same way
        in the rounds ``sync`` / ``settle`` run."""
        self.drain(i)
        actor = self.workers[i]  # Ray keeps the handle across a restart; its store id may change
        sid = self.store_of[i]
        for _ in range(max_rounds):
            sid = self.store_of[self.workers.index(actor)]
            self.sync()
            if actor not in self.workers:
                return sid
        left = sum(1 for m in self.regions.values() if m.peer_on(sid))
        raise ClusterError(f"opforge.cluster: worker {i} (store {sid}) still holds {left} region replicas "
                           f"after {max_rounds} heartbeat rounds; it is left offline, not removed")

    def _adopt_drains(self) -> None:
        """Stores of live workers that the driver has offline (an operator's ``store delete``) drain."""
        for sid in self.store_of:
            if sid not in self.draining and self._store_state(sid) == "offline":
                self.draining.add(sid)

    def _retire_drained(self) -> None:
        """Stop the workers whose drained store is now a tombstone holding no replica."""
        done = [sid for sid in self.draining if sid in self.store_of and self._store_state(sid) == "tombstone"
                and not any(m.peer_on(sid) for m in self.regions.values())]
        for sid in done:
            i = self.store_of.index(sid)
            try:
                _ray().kill(self.workers[i], no_restart=True)
            except Exception:  # already gone
                pass
            del self.workers[i], self.store_of[i], self.pids[i], self.devices[i]
            self.draining.discard(sid)
        if done:
            self._form_group()

    def _store_state(self, sid: int) -> str | None:
        store = self.pd.driver.cluster.get_store(sid)
        return None if store is None else store.state.value

    def worker_of(self, store_id: int) -> int | None:
        return self.store_of.index(store_id) if store_id in self.store_of else None

    def _make_store(self, i: int, info: dict) -> None:
        sid = next(self._store_ids)
        labels = {"host": info["host"], "worker": str(info["index"])}
        if self.backend == "nccl":  # the GPUs of one host share its NVLink domain (HGX)
            labels["nvlink"] = info["host"]
        _ray().get(self.workers[i].join.remote(sid, labels))
        self.store_of[i], self.pids[i], self.devices[i] = sid, info["pid"], info["device"]

    def _form_group(self) -> None:
        ray = _ray()
        first = ray.get(self.workers[0].info.remote())
        port = ray.get(self.workers[0].free_port.remote())
        ray.get([w.form_group.remote(i, self.size, first["ip"], port, self.group_timeout)
                 for i, w in enumerate(self.workers)])

    def held_by(self, i: int) -> dict[int, int]:
        """Region id -> rows of the replicas worker ``i`` holds (asked of the worker)."""
        return _ray().get(self.workers[i].held.remote())

    def worker_pids(self) -> list[int]:
        return list(self.pids)

    def kill_worker(self, i: int) -> int:
        """SIGKILL worker ``i``'s process (a crash, for tests and demos); Ray restarts it."""
        os.kill(self.pids[i], signal.SIGKILL)  # the coordinator learns of it as from a real crash
        return self.pids[i]

    def inject_failure(self, i: int, message: str = "injected failure") -> None:
        """Make worker ``i``'s next query or stream call raise (``Worker.inject_failure``) while its
        peers wait for it in a collective: one worker failing alone, for tests and demos."""
        if not 0 <= i < self.size:
            raise ValueError(f"opforge.cluster: no worker {i} (the cluster has {self.size})")
        _ray().get(self.workers[i].inject_failure.remote(message))

    def recover(self, timeout: float = 120.0) -> list[int]:
        """Bring the cluster back after workers died: wait for Ray's restarts, mark their old stores
        offline and drop their replicas (new leaders among the survivors), re-form the group. Returns the
        indexes of the restarted workers."""
        ray = _ray()
        self._end_stragglers()
        deadline = time.monotonic() + timeout
        infos: list[dict | None] = [None] * self.size
        while any(x is None for x in infos):
            for i, w in enumerate(self.workers):
                if infos[i] is None:
                    try:
                        infos[i] = ray.get(w.info.remote(), timeout=10)
                    except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError):
                        if time.monotonic() > deadline:
                            raise ClusterError(f"opforge.cluster: worker {i} did not come back within "
                                               f"{timeout:g} s") from None
                        time.sleep(0.2)
        restarted = [i for i, info in enumerate(infos) if info["store_id"] != self.store_of[i]]
        for i in restarted:
            old = self.store_of[i]
            self.dead_stores.add(old)
            self.pd.service.set_store_state(old, {"state": "offline"})
            self._remove_failed_store(old)
            self._make_store(i, infos[i])
            if old in self.draining:  # it died while being drained: the drain goes on with its new store
                self.draining.discard(old)
                self.pd.service.set_store_state(self.store_of[i], {"state": "offline"})
                self.draining.add(self.store_of[i])
        self._form_group()
        self._suspect = False
        return restarted

    def _remove_failed_store(self, dead_store: int) -> None:
        """Drop the dead store's peers from every region, a surviving voter leading where the dead
        one led (the election Raft would hold). With 2 replicas a lost peer also loses the quorum,
        so the driver will not replace it by a membership change; a table region is read-only and
        its surviving copy is whole, so the coordinator removes the peer itself (PD's unsafe
        recovery) and the rule checker then adds the missing replica elsewhere."""
        for meta in self.regions.values():
            gone = meta.peer_on(dead_store)
            if gone is None:
                continue
            alive = [p for p in meta.peers if p["store_id"] not in self.dead_stores and p["role"] == "voter"]
            if not alive:
                raise ClusterError(f"opforge.cluster: region {meta.id} of table {meta.table!r} lost every "
                                   "replica (more workers died than it had replicas)")
            if meta.leader_peer_id == gone["id"]:
                meta.leader_peer_id = alive[0]["id"]
            meta.peers.remove(gone)
            meta.conf_ver += 1
            self._push(meta)

    # -- tables -------------------------------------------------------------------------------------
    def place_table(self, name: str, data: pa.Table, partition_by: str | None = None,
                    regions: int | None = None) -> list[int]:
        """Cut ``data`` into ``regions`` regions (default ``regions_per_table``) and put ``replicas``
        copies of each on distinct workers (leaders round-robin). Returns the region ids."""
        if partition_by is not None and partition_by not in data.column_names:
            raise ValueError(f"register: partition_by {partition_by!r} is not a column of {name!r}")
        self._ensure_ready()
        if name in self.tables:
            self.drop_table(name)
        tid = next(self._table_ids)
        parts = R.split(data, regions or self.regions_per_table, partition_by)
        ids, loads = [], []
        for i, part in enumerate(parts):
            rid = next(self._region_ids)
            holders = [(i + k) % self.size for k in range(self.replicas)]
            peers = [{"id": next(self._peer_ids), "store_id": self.store_of[w], "role": "voter"} for w in holders]
            meta = R.RegionMeta(rid, name, i, R.region_key(tid, i).hex(), R.region_key(tid, i + 1).hex(), peers,
                                peers[0]["id"], rows=part.num_rows, bytes=R.table_bytes(part), table_id=tid)
            self.regions[rid] = meta
            ids.append(rid)
            rows = _ray().put(part)  # serialized once for all its replicas
            loads += [self.workers[w].load_region.remote(meta.to_json(), rows) for w in holders]
        _ray().get(loads)
        self.tables[name] = {"id": tid, "regions": ids, "partition_by": partition_by, "schema": data.schema,
                             "buckets": len(parts)}
        self._publish()
        self.sync()
        return ids

    def drop_table(self, name: str) -> None:
        info = self.tables.pop(name)
        ray = _ray()
        driver = self.pd.driver
        for rid in info["regions"]:
            meta = self.regions.pop(rid)
            ray.get([self.workers[w].drop_region.remote(rid) for w in self._holders(meta)])
            with self.pd.service.lock:  # the driver forgets the region (no heartbeat will say so)
                if rid in driver.cluster.regions:
                    driver.cluster.remove_region(rid)
                    driver.controller.region_removed(rid, driver.clock())

    def _holders(self, meta: R.RegionMeta) -> list[int]:
        return [w for p in meta.peers if (w := self.worker_of(p["store_id"])) is not None]

    def _push(self, meta: R.RegionMeta) -> None:
        ray = _ray()
        ray.get([self.workers[w].update_region.remote(meta.to_json()) for w in self._holders(meta)])

    # -- heartbeats and operator steps --------------------------------------------------------------
    def sync(self, rounds: int = 1) -> int:
        """Heartbeat rounds: every worker reports, the driver ticks, the steps it answered run.
        Returns the number of steps run."""
        self._ensure_ready()
        ray = _ray()
        ran = 0
        for _ in range(rounds):
            down = sorted(self.dead_stores)
            try:
                answers = ray.get([w.heartbeat.remote(down) for w in self.workers])
            except ray.exceptions.RayError as e:
                self._suspect = True
                raise RetryableError(f"opforge.cluster: a worker was lost during a heartbeat round ({e!r:.200}); "
                                     "the cluster recovers on the next call") from e
            for steps in answers:
                for s in steps:
                    ran += self._run_step(s["region_id"], s["step"])
            self.pd.tick()
            self._adopt_drains()
            self._bury_dead_stores()
            self._retire_drained()
        self.steps_run += ran
        return ran

    def settle(self, max_rounds: int = 60) -> int:
        """Heartbeat rounds until the driver has no operator in flight (re-replication, balance)."""
        total = 0
        for _ in range(max_rounds):
            total += self.sync()
            if not self.operators_in_flight():
                total += self.sync()  # the last steps' effects reported
                if not self.operators_in_flight():
                    return total
        return total

    def run_stream_job(self, env, transformations: list, job_name: str):
        """``StreamExecutionEnvironment(cluster=self).execute()``: the job on the workers
        (``stream_job.ClusterStreamJob``). Called by the stream package, which imports nothing of
        this one (the layers read cluster -> stream)."""
        from opforge.cluster.stream_job import ClusterStreamJob

        return ClusterStreamJob(env, transformations, job_name).run()

    def watch_hot(self, hot_bytes: float | None) -> None:
        """Split a region read at ``hot_bytes`` per second or more when it far outreads the others,
        and spread the hot regions' leaders (``pd_service.watch_hot``); None: stop. A split table
        keeps its answers but no longer joins co-located with the tables partitioned like it."""
        pd_service.check_hot_bytes(hot_bytes)
        with self.pd.service.lock:
            pd_service.watch_hot(self.pd.driver, hot_bytes)

    def operators_in_flight(self) -> list[dict]:
        ops = self.pd.service.operators(0)
        return ops["running"] + ops["waiting"]

    def _bury_dead_stores(self) -> None:
        cluster = self.pd.driver.cluster
        for sid in list(self.dead_stores | self.draining):
            store = cluster.get_store(sid)
            if store is not None and store.state.value == "offline" and cluster.region_count(sid) == 0:
                self.pd.service.set_store_state(sid, {"state": "tombstone"})

    def _run_step(self, region_id: int, step: dict) -> int:
        meta = self.regions.get(region_id)
        if meta is None:
            return 0
        kind = step["kind"]
        if kind in ("AddLearner", "AddPeer"):
            dst = self.worker_of(step["to_store"])
            if meta.peer_on(step["to_store"]) is not None or dst is None:
                return 0
            src = self.worker_of(meta.leader_store)
            ray = _ray()
            ray.get([self.workers[src].send_region.remote(region_id, dst),
                     self.workers[dst].recv_region.remote(meta.to_json(), src)])
            role = "learner" if kind == "AddLearner" else "voter"
            meta.peers.append({"id": step["peer_id"], "store_id": step["to_store"], "role": role})
            meta.conf_ver += 1
        elif kind == "PromoteLearner":
            p = meta.peer_on(step["to_store"])
            if p is None or p["role"] == "voter":
                return 0
            p["role"] = "voter"
            meta.conf_ver += 1
        elif kind == "TransferLeader":
            p = meta.peer_on(step["to_store"])
            if p is None or p["role"] != "voter" or meta.leader_peer_id == p["id"]:
                return 0
            meta.leader_peer_id = p["id"]
        elif kind == "RemovePeer":
            p = meta.peer_on(step["from_store"])
            if p is None or p["id"] == meta.leader_peer_id:
                return 0
            meta.peers.remove(p)
            meta.conf_ver += 1
            w = self.worker_of(step["from_store"])
            if w is not None:
                _ray().get(self.workers[w].drop_region.remote(region_id))
        elif kind in ("ChangePeerV2Enter", "ChangePeerV2Leave"):
            enter = kind == "ChangePeerV2Enter"
            for sid in step["promote"]:
                if (p := meta.peer_on(sid)) is not None:
                    p["role"] = "incoming_voter" if enter else "voter"
            for sid in step["demote"]:
                if (p := meta.peer_on(sid)) is not None:
                    p["role"] = "demoting_voter" if enter else "learner"
            meta.conf_ver += 1
        elif kind == "SplitRegion":
            return self._split(meta)
        else:  # merge: tables keep their hash partitioning (merging is off)
            return 0
        self._push(meta)
        return 1

    def _split(self, meta: R.RegionMeta) -> int:
        """The SplitRegion step: every replica cuts the region's rows in two by the next hash bit
        (``regions.split_half``); the lower half keeps the region (its range ends at the split key,
        its version goes up), the upper half is a new region with new peers on the same stores."""
        info = self.tables.get(meta.table)
        if info is None or len(meta.sub) >= R.MAX_SPLIT_BITS or meta.rows < 2:
            return 0
        if meta.table.startswith("stream/"):  # a stream job's key-group range: its subtask owns the range whole
            return 0
        with self.pd.service.lock:  # new peer ids from the driver's allocator (PD's AskBatchSplit)
            peer_ids = {p["id"]: self.pd.driver.ids() for p in meta.peers}
        left = R.RegionMeta(**{**meta.to_json(), "sub": meta.sub + "0", "version": meta.version + 1,
                               "peers": [dict(p) for p in meta.peers]})
        right = R.RegionMeta(**{**meta.to_json(), "id": next(self._region_ids), "sub": meta.sub + "1",
                                "version": meta.version + 1,
                                "peers": [{**p, "id": peer_ids[p["id"]]} for p in meta.peers],
                                "leader_peer_id": peer_ids[meta.leader_peer_id]})
        for half in (left, right):
            start, end = R.sub_range(meta.table_id, meta.index, half.sub)
            half.start_key, half.end_key = start.hex(), end.hex()
        ray = _ray()
        rows = ray.get([self.workers[w].split_region.remote(meta.id, left.to_json(), right.to_json(),
                                                            info["partition_by"], info["buckets"])
                        for w in self._holders(meta)])
        if any(r != rows[0] for r in rows):
            raise ClusterError(f"opforge.cluster: the replicas of region {meta.id} of {meta.table!r} split into "
                               f"different halves {rows}: they do not hold the same rows")
        if 0 in rows[0]:
            return 0  # one side of the hash bit is empty (a single hot key): the replicas were left whole
        (left.rows, right.rows), whole = rows[0], max(meta.bytes, 1)
        left.bytes, right.bytes = whole * left.rows // meta.rows, whole * right.rows // meta.rows
        self.regions[meta.id], self.regions[right.id] = left, right
        info["regions"].insert(info["regions"].index(meta.id) + 1, right.id)
        self.splits += 1
        return 1

    # -- queries ------------------------------------------------------------------------------------
    def leaders(self, tables) -> list[dict[str, list[int]]]:
        """For each worker: table -> the region ids it leads."""
        out: list[dict[str, list[int]]] = [{t: [] for t in tables} for _ in self.workers]
        for t in tables:
            if t not in self.tables:
                raise ClusterError(f"opforge.cluster: table {t!r} is not placed on the cluster")
            for rid in self.tables[t]["regions"]:
                w = self.worker_of(self.regions[rid].leader_store)
                if w is None:
                    raise ClusterError(f"opforge.cluster: region {rid} of {t!r} has no live leader")
                out[w][t].append(rid)
        return out

    def layout(self, table: str) -> tuple[str, str]:
        """(partition key, signature): two tables of equal signature have the rows of each key hash
        on the same worker (same region count, region i of both led by the same worker)."""
        info = self.tables[table]
        owners = [f"{m.index}{'.' + m.sub if m.sub else ''}:{self.worker_of(m.leader_store)}"
                  for m in (self.regions[rid] for rid in info["regions"])]  # split regions: their hash bits too
        return info["partition_by"], f"regions/{info['buckets']}/" + ",".join(owners)

    def execute(self, plan, options: dict) -> pa.Table:
        """Run a planned query on every worker over the regions it leads; the rows gathered here."""
        from opforge.sql import plan as P

        self._ensure_ready()
        scans: set[str] = set()

        def walk(n):
            if isinstance(n, P.Scan):
                scans.add(n.table)
            for c in n.inputs():
                walk(c)

        walk(plan)
        layouts = {t: self.layout(t) for t in scans if self.tables[t]["partition_by"] is not None}
        schemas = {t: self.tables[t]["schema"] for t in scans}
        futures = [w.run_query.remote(plan, lead, options, layouts, schemas)
                   for w, lead in zip(self.workers, self.leaders(scans))]
        answers = self._collect(futures)
        answers.sort(key=lambda a: a["rank"])
        self.last_query = {"workers": [{k: a[k] for k in ("rank", "rows", "ms", "exchanges")} for a in answers]}
        parts = [a["result"] for a in answers if a["result"] is not None]
        return pa.concat_tables(parts) if len(parts) > 1 else parts[0]

    def report(self) -> str:
        """The last query per worker: rows it ended with, its time, and each exchange (EXPLAIN
        ANALYZE's distributed part)."""
        lines = []
        for w in self.last_query.get("workers", []):
            lines.append(f"worker {w['rank']}: {w['rows']} rows out, {w['ms']:.1f} ms")
            for e in w["exchanges"]:
                lines.append(f"  {e['exchange']:<18} {e['rows_in']:>9} -> {e['rows_out']:<9} rows  "
                             f"{e['bytes_sent']:>11} B  {e['ms']:8.1f} ms  {e['node']}")
        return "\n".join(lines)

    def _collect(self, futures: list) -> list:
        """Every worker's answer (``futures[i]``: worker ``i``'s call). When one worker's call fails,
        its peers may be blocked in a collective waiting for it: they are told to leave it
        (``_abort_peers``) and get ``ABORT_GRACE_S`` to fail too; then the first failure that is
        not a consequence of another (a peer's broken collective) is raised, naming its worker.
        Workers still in the call are stragglers, ended by ``recover`` before the next call."""
        ray = _ray()
        index = {ref: i for i, ref in enumerate(futures)}
        pending, answers, failed = list(futures), {}, []  # failed: (worker, Ray's error), as they came
        deadline = time.monotonic() + self.group_timeout * 4
        while pending and time.monotonic() < deadline:
            done, pending = ray.wait(pending, num_returns=1, timeout=max(deadline - time.monotonic(), 0.01))
            for ref in done:
                try:
                    answers[ref] = ray.get(ref)
                except ray.exceptions.RayError as e:
                    failed.append((index[ref], e))
            if failed and deadline > time.monotonic() + ABORT_GRACE_S:  # the first failure
                deadline = time.monotonic() + ABORT_GRACE_S
                self._abort_peers([i for i, _ in failed], [index[r] for r in pending])
        if not failed and not pending:
            return [answers[f] for f in futures]
        self._suspect = True  # the group is left behind broken: re-formed before the next call
        self._stragglers = [(self.workers[index[r]], r) for r in pending]
        if not failed:
            raise RetryableError(f"opforge.cluster: workers {sorted(index[r] for r in pending)} gave no answer "
                                 f"within {self.group_timeout * 4:g} s; the cluster recovers (restarting them) "
                                 "before the next call: run it again")
        i, error = next(((i, e) for i, e in failed if not _consequence(_inner(e))), failed[0])
        inner = _inner(error)
        if not _lost_worker(inner):
            raise _on_worker(inner, i)  # the call's own error (a SqlError, an operator's), not a lost worker
        text = str(inner).strip().splitlines()
        raise RetryableError(f"opforge.cluster: worker {i} failed while the call ran ({type(inner).__name__}: "
                             f"{text[0][:300] if text else ''}); the cluster recovers before the next call: "
                             "run it again") from error

    def _abort_peers(self, failed: list[int], running: list[int]) -> None:
        """Free the peers of a failed worker from the collective they wait in: the failed ones leave
        the group (on Gloo their closed connections fail every rank waiting on them, which then
        leave in turn; a worker's failed call normally left already: ``Worker._leaving_on_error``);
        on NCCL, whose peers would wait out the group's timeout in a collective, the running ones
        abort theirs from their control thread. Waited for by ``_end_stragglers`` (before the group is
        re-formed: an abort must not reach the new one)."""
        refs = [self.workers[i].leave_group.remote() for i in failed]
        if self.backend == "nccl":
            refs += [self.workers[i].abort_group.options(concurrency_group="control").remote() for i in running]
        self._aborts = refs

    def _end_stragglers(self) -> None:
        """Wait (``STRAGGLER_WAIT_S``) for the workers still in a call that failed; kill those that
        do not end it (Ray restarts them; ``recover`` then treats them as lost)."""
        ray = _ray()
        stragglers, self._stragglers = self._stragglers, []
        aborts, self._aborts = self._aborts, []
        if aborts:  # their errors (a dead worker's) are recover's to handle
            done, _ = ray.wait(aborts, num_returns=len(aborts), timeout=STRAGGLER_WAIT_S)
            for ref in done:
                try:
                    ray.get(ref)
                except ray.exceptions.RayError:
                    pass
        if not stragglers:
            return
        _, stuck = ray.wait([r for _, r in stragglers], num_returns=len(stragglers), timeout=STRAGGLER_WAIT_S)
        for actor, ref in stragglers:
            if ref in stuck:
                ray.kill(actor, no_restart=False)

    def _ensure_ready(self) -> None:
        if self._stopped:
            raise ClusterError("opforge.cluster: this cluster was stopped")
        if self._suspect:
            self.recover()
            self.settle()

    # -- status -------------------------------------------------------------------------------------
    def status(self) -> dict:
        """Stores, regions, leaders and operators in flight, as the placement driver sees them."""
        svc = self.pd.service
        stores = svc.stores()["stores"]
        return {"stores": stores, "regions": [m.to_json() for m in self.regions.values()],
                "operators": self.operators_in_flight(), "steps_run": self.steps_run,
                "workers": [{"index": i, "store_id": s, "pid": p} for i, (s, p) in
                            enumerate(zip(self.store_of, self.pids))]}

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        ray = _ray()
        for w in self.workers:
            try:
                ray.kill(w, no_restart=True)
            except Exception:  # already gone
                pass
        endpoint.remove(self.pd.url)
        self.pd.stop()
        if self._owns_ray:
            ray.shutdown()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def _inner(error: BaseException) -> BaseException:
    """The worker's own exception, not Ray's wrapper of it (none when the process died)."""
    return getattr(error, "cause", None) or error


def _consequence(error: BaseException) -> bool:
    """A failure another worker's caused: a collective broken by a peer that failed or left."""
    return isinstance(error, CollectiveError) or any(
        m in str(error) for m in ("Connection closed by peer", "Connection reset by peer", "Broken pipe"))


def _on_worker(error: BaseException, i: int) -> BaseException:
    """``error`` with the worker it came from named in its message."""
    where = f"(on worker {i})"
    if error.args and isinstance(error.args[0], str):
        error.args = (f"{error.args[0]} {where}",) + error.args[1:]
    else:
        error.add_note(where)
    return error


def _lost_worker(error: BaseException) -> bool:
    """A failure a dead peer explains (a broken collective, a restarted worker without its regions),
    not the query's own error (a SqlError, a bad argument), which every worker raises alike, nor a
    stream job's (an operator's error: replaying the input raises it again)."""
    from opforge.stream.errors import StreamOperatorError

    return not isinstance(error, (ValueError, TypeError, NotImplementedError, StreamOperatorError))


# Ray hides the GPUs from an actor that asked for none, unless this is set (in the raylet's
# environment and the actors').
SHARE_GPUS = "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"


def _local_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def start(address: str | None = None, workers: int | None = None, *, replicas: int = 2,
          regions_per_table: int | None = None, backend: str | None = None, num_cpus: int | None = None,
          env: dict | None = None, temp_dir: str | None = None, **options) -> Cluster:
    """Start a cluster: embed a local Ray instance (``address=None``) or attach to one, then one
    worker per GPU (``workers`` defaults to the GPUs Ray sees, else 2 CPU workers). ``env``:
    environment variables of the worker processes (a local Ray only). ``replicas``: copies of each
    region, on distinct workers. ``backend``: the workers' group, None to choose: NCCL with a GPU per
    worker; with more local workers than GPUs, Gloo (NCCL takes one rank per GPU), the workers still
    sharing the GPUs to compute (Ray is told not to hide them from these CPU actors) and moving data
    through host memory. An explicit ``"gloo"`` keeps the workers on the CPU."""
    ray = _ray()
    owns = False
    if not ray.is_initialized():
        if address is None:
            n = workers or 2
            if backend is None and 0 < _local_gpus() < n:
                env = {SHARE_GPUS: "1", **(env or {})}
                os.environ[SHARE_GPUS] = "1"  # read by the raylet ray.init starts next
            tmp = temp_dir or tempfile.mkdtemp(prefix="opf_ray_", dir="/tmp")
            for attempt in (1, 2):  # Ray gives its raylet 30 s to start: a loaded host can miss that once
                try:
                    ray.init(num_cpus=num_cpus or n, include_dashboard=False, _temp_dir=tmp, log_to_driver=False,
                             runtime_env={"env_vars": dict(env or {})}, configure_logging=False)
                    break
                except Exception as e:
                    ray.shutdown()
                    if attempt == 2 or "timed out during startup" not in str(e):
                        raise
        else:
            ray.init(address=address, log_to_driver=False)
        owns = True
    if workers is None:
        workers = int(ray.cluster_resources().get("GPU", 0)) or 2
    host = "127.0.0.1" if address is None else ray.util.get_node_ip_address()
    return Cluster(workers, replicas=replicas, regions_per_table=regions_per_table, backend=backend,
                   owns_ray=owns, pd_host=host, **options)

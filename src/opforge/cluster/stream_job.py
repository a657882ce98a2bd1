"""A stream job on the cluster: the coordinator's side (``StreamExecutionEnvironment(cluster=c)``).

The job's keyed state is cut into ``R`` key-group ranges (``R``: the parallelism of its keyed
operators), each a region of the placement driver, replicated on distinct workers under the
cluster's rules (``Cluster.place_table``: the driver sees them in heartbeats, re-replicates and
balances them like table regions). Every worker runs the subtasks of the regions it leads
(``stream_task.py``); records move between workers over the process group; the coordinator drives
rounds, checkpoints and commits through Ray calls:

* a round: every worker fires its timers, polls its source subtasks once and delivers what they
  produced, across workers, until nothing is in flight (``StreamTask.round``);
* a checkpoint (between rounds: aligned, no record in flight): every worker snapshots the regions
  it leads and sends each snapshot to the region's followers; the acknowledgements carry the sinks'
  output since the last checkpoint, which the coordinator writes to the job's sinks only once every
  worker has acked (the checkpoint is then complete; the replicas drop older ones). The sinks run
  here: a two-phase-commit sink (``FileSink``) pre-commits and commits each checkpoint's output at
  once, since it is already final;
* after a checkpoint, a heartbeat round: the driver's operator steps run (balance, a scale-out, an
  admin's ``operator add``); when they moved the job's regions (a new leader, a replica added or
  removed), the job continues from that checkpoint on the new leaders (routing follows the map);
* a worker lost mid-job (``RetryableError``): the cluster recovers (dead store offline, replicas
  promoted, the group re-formed, lost replicas added back), and the job restarts on the new leaders
  from the last completed checkpoint; output after it was never committed, so the sinks see every
  record exactly once.
"""
from __future__ import annotations

import itertools
import time

from opforge.cluster import stream_wire as wire
from opforge.cluster.errors import ClusterError, RetryableError
from opforge.cluster.stream_task import initial_state
from opforge.stream.executor import JobExecutionResult, OperatorMetrics

MAX_RESTARTS = 3
_job_ids = itertools.count(1)


def _ray():
    import ray

    return ray


class _RegionsMoved(Exception):
    """The driver moved the job's regions after a checkpoint: continue from it on the new leaders."""


class ClusterStreamJob:
    def __init__(self, env, transformations: list, job_name: str, max_restarts: int = MAX_RESTARTS):
        if not any(t.kind == "sink" for t in transformations):
            raise ValueError(f"execute({job_name!r}): the job has no sink (add sink_to, collect or print)")
        keyed = {t.parallelism for t in transformations if any(i.key is not None for i in t.inputs)}
        if len(keyed) > 1:
            raise ValueError(f"execute({job_name!r}) on a cluster: the keyed operators have parallelisms "
                             f"{sorted(keyed)}; they share one set of key-group regions, so give them one parallelism")
        broadcast = next((t for t in transformations if t.kind == "broadcast_process"), None)
        if broadcast is not None:
            raise NotImplementedError(f"execute({job_name!r}) on a cluster: operator {broadcast.name!r} uses broadcast "
                                      "state, which runs in one process only for now (unions, connected streams and "
                                      "joins run on the cluster)")
        aligned = [t.name for t in transformations
                   if t.kind == "source" and t.params["watermark_strategy"].alignment_group is not None]
        if aligned:
            raise NotImplementedError(f"execute({job_name!r}) on a cluster: watermark alignment (source "
                                      f"{aligned[0]!r}) runs in one process only for now")
        self.env, self.cluster, self.transformations, self.job_name = env, env.cluster, transformations, job_name
        # the job's sinks run here, on committed output only: (graph order, sink, parallelism)
        self.sinks = [(order, t.params["sink"], t.parallelism) for order, t in enumerate(transformations)
                      if t.kind == "sink"]
        self.ranges = keyed.pop() if keyed else max(t.parallelism for t in transformations)
        self.table = f"stream/{job_name}/{next(_job_ids)}"
        self.max_restarts = max_restarts
        self.next_id, self.completed, self.restarts, self.moves = 1, 0, 0, 0
        self.opened: dict | None = None  # the spec the running attempt was opened with
        self.source_records, self._uncommitted = 0, 0  # records the sources emitted (up to the last checkpoint)
        self.metrics: dict[str, OperatorMetrics] = {}  # per operator, over the workers
        self.exchanged = {"bytes": 0, "records": 0}  # sent between workers (the last attempt)
        self.checkpoints: list[str] = []
        self.last_time = env.clock.now()

    # -- the job --------------------------------------------------------------------------------
    def run(self, after_round=None) -> JobExecutionResult:
        """Run to the end of the input. ``after_round(job, n)``: called after each round (tests
        and demos inject failures there)."""
        t0 = time.perf_counter()
        c = self.cluster
        for _, sink, p in self.sinks:
            if callable(getattr(sink, "open", None)):
                for i in range(p):
                    sink.open(i, p)
        c.place_table(self.table, initial_state(self.ranges), regions=self.ranges)
        done = False
        try:
            while True:
                try:
                    self._attempt(after_round)
                    break
                except _RegionsMoved:
                    self.moves += 1
                except RetryableError:
                    if self.restarts >= self.max_restarts:
                        raise
                    self.restarts += 1
                    c._ensure_ready()  # new leaders, the group re-formed, lost replicas added back
            done = True
        finally:
            try:
                self._release()
            except Exception:
                if done:
                    raise
        for _, sink, _ in self.sinks:
            sink.finish()
        return JobExecutionResult(self.job_name, (time.perf_counter() - t0) * 1000, self.metrics, self.source_records,
                                  list(self.checkpoints), None, self.restarts)

    def _attempt(self, after_round) -> None:
        """One run from the last completed checkpoint (0: the start) to the end of the input."""
        c = self.cluster
        self._uncommitted = 0  # replayed from the checkpoint
        self.opened = self.spec()
        c._collect([w.stream_open.remote(self.opened, self.transformations) for w in c.workers])
        clock, n = self.env.clock, 0
        while True:
            clock.tick()
            answers = self._call("round", clock.now())
            self._uncommitted += sum(a["records"] for a in answers)
            n += 1
            if after_round is not None:
                after_round(self, n)
            if all(a["finished"] for a in answers):
                break
            if self._due():
                self.checkpoint()
                self._follow_regions()
        self._count(self._call("finish"))
        self.checkpoint()  # the final one commits the last output

    def _follow_regions(self) -> None:
        """A heartbeat round; when its steps moved the job's regions, reopen on the new map."""
        self.cluster.sync()
        if self.spec()["regions"] != self.opened["regions"]:
            raise _RegionsMoved

    def _count(self, answers: list) -> None:
        """Sum the workers' counters (``StreamTask.finish``) per operator, as ``run_job`` names them."""
        self.metrics = {}
        for order, t in enumerate(self.transformations):
            rows = [m for a in answers for m in a["metrics"][order]]
            agg = OperatorMetrics(*(sum(r[k] for r in rows) for k in range(3)), sum(r[3] for r in rows))
            self.metrics[t.name if t.name not in self.metrics else f"{t.name}#{t.id}"] = agg
        self.exchanged = {k: sum(a["exchanged"][k] for a in answers) for k in ("bytes", "records")}

    def spec(self) -> dict:
        """What every worker is told at (re)start: the regions' leaders and followers now."""
        c = self.cluster
        regions = []
        for rid in c.tables[self.table]["regions"]:
            meta = c.regions[rid]
            leader = c.worker_of(meta.leader_store)
            if leader is None:
                raise ClusterError(f"stream job {self.job_name!r}: region {rid} has no live leader")
            regions.append({"id": rid, "leader": leader, "followers": [w for w in c._holders(meta) if w != leader]})
        env = self.env
        return {"regions": regions, "device": str(env.device), "now": env.clock.now(), "batch_size": env.batch_size,
                "watermark_granularity": env.watermark_granularity, "restore": self.completed}

    def leaders(self) -> list[int]:
        """The worker leading each key-group range (where its subtasks run)."""
        return [r["leader"] for r in self.spec()["regions"]]

    def _call(self, method: str, *args) -> list:
        c = self.cluster
        return c._collect([w.stream_call.remote(method, *args) for w in c.workers])

    # -- checkpoints ----------------------------------------------------------------------------
    def _due(self) -> bool:
        cfg = self.env.checkpoint_config
        return cfg is not None and self.env.clock.now() - self.last_time >= cfg.interval_ms

    def checkpoint(self) -> int:
        """Snapshot every region (aligned: between rounds), then commit the sinks' output."""
        cid = self.next_id
        self.next_id += 1
        answers = self._call("snapshot", cid)
        sinks = {order: sink for order, sink, _ in self.sinks}
        device = self.env.device
        batches = [(order, i, wire.decode_batch(data, device)) for a in answers for order, i, data in a["output"]]
        for order, i, batch in batches:  # every region acked: checkpoint cid is complete
            sinks[order].write(batch, i)
        for _, sink, p in self.sinks:  # a two-phase-commit sink (FileSink) commits it at once
            if callable(getattr(sink, "snapshot_state", None)):
                for i in range(p):
                    sink.snapshot_state(i, cid)
            if callable(getattr(sink, "notify_checkpoint_complete", None)):
                for i in range(p):
                    sink.notify_checkpoint_complete(i, cid)
        self.completed = cid
        self.checkpoints.append(f"chk-{cid}")
        self.source_records, self._uncommitted = self.source_records + self._uncommitted, 0
        self.last_time = self.env.clock.now()
        self._call("commit", cid)
        return cid

    def _release(self) -> None:
        c = self.cluster
        if not c._suspect:
            _ray().get([w.stream_close.remote() for w in c.workers])
        c.drop_table(self.table)

"""The long-lived worker: one per GPU (or per CPU process), run as a Ray actor by ``cluster.py``.

A worker is one store of the placement driver. It holds region replicas (Arrow tables plus a copy
of their metadata), sends the driver its store heartbeat and the region heartbeats of the regions it
leads (``placement/client.py``), runs its part of distributed SQL queries over the leader regions
(``dist_executor.py``), and sends or receives region snapshots when the coordinator runs an
operator step. Data moves only over the torch.distributed group the workers form
(``opforge.distributed``: NCCL on GPUs, Gloo on CPU); the calls that drive it are Ray's.

The class is plain Python (Ray wraps it), so a test can also drive one in-process.
"""
from __future__ import annotations

import os
import socket
import time

import pyarrow as pa
import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d

import opforge.distributed as D
from opforge.cluster import regions as R
from opforge.placement.client import HeartbeatLoop, PDClient


def compute_device(backend: str, index: int) -> torch.device:
    """Where a worker's queries run: its GPU whenever it sees one. Under NCCL, Ray gives each worker
    its own GPU (device 0 of what it sees); under Gloo with GPUs visible (more workers than GPUs,
    ``cluster.start`` shares them) workers take the GPUs in turn and the group's collectives move
    data through host memory (``opforge.distributed.device``). A worker that sees no GPU runs on
    the CPU."""
    if backend == "nccl":
        return torch.device("cuda", 0)
    if torch.cuda.is_available():
        return torch.device("cuda", index % torch.cuda.device_count())
    return torch.device("cpu")


def _capacity(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


class Worker:
    def __init__(self, index: int, pd_url: str, token: str, backend: str | None = None, threads: int = 1):
        torch.set_num_threads(threads)
        self.index = index
        self.client = PDClient(pd_url, token, timeout=30)
        self.backend = backend or D.group.default_backend()
        self.device = compute_device(self.backend, index)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)  # Triton launches on the current device
        self.host = socket.gethostname()
        self.store_id: int | None = None  # None until the coordinator makes this process a store
        self.meta: dict[int, R.RegionMeta] = {}
        self.data: dict[int, pa.Table] = {}
        self.schemas: dict[str, pa.Schema] = {}
        self._tables: dict[tuple, object] = {}  # (table, region ids) -> sql Table, per leader set
        self._steps: list[dict] = []
        self._flow = {"bytes_read": 0, "keys_read": 0, "bytes_written": 0, "keys_written": 0, "queries": 0}
        self._region_reads: dict[int, list[int]] = {}  # region id -> [bytes, rows, queries] since its heartbeat
        self._last_hb = self._last_region_hb = time.monotonic()
        self._injected: str | None = None  # inject_failure's message

    # -- membership -----------------------------------------------------------------------------
    def info(self) -> dict:
        return {"index": self.index, "pid": os.getpid(), "host": self.host, "store_id": self.store_id,
                "ip": _node_ip(), "backend": self.backend,
                "device": str(self.device)}

    def free_port(self) -> int:
        with socket.socket() as s:
            s.bind(("", 0))
            return int(s.getsockname()[1])

    def join(self, store_id: int, labels: dict) -> dict:
        """Become store ``store_id`` of the placement driver."""
        self.store_id = store_id
        cap = _capacity(self.device)
        return self.client.register_store({"store_id": store_id, "address": f"{self.host}:{os.getpid()}",
                                           "capacity": cap, "available": cap, "labels": labels})

    def form_group(self, rank: int, world: int, addr: str, port: int, timeout: float) -> int:
        """(Re)form the workers' process group; every worker calls it at once."""
        D.destroy()
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK="0", MASTER_ADDR=addr,
                          MASTER_PORT=str(port))
        return D.init(self.backend, timeout=timeout).rank

    def leave_group(self) -> None:
        """Leave the group (a no-op when already left): on Gloo this closes this rank's connections,
        so peers blocked on it in a collective fail now instead of at the group's timeout. On NCCL
        the group is aborted, not destroyed: destroying could wait on this rank's collectives,
        which wait on peers that may never come (the coordinator aborts theirs: :meth:`abort_group`)."""
        if self.backend == "nccl":
            _abort()
        D.destroy()

    def abort_group(self) -> None:
        """Abort the group from the coordinator's control thread while this worker's task may be
        blocked in a collective (``Cluster._abort_peers``, after a peer failed): NCCL's abort makes
        the blocked collective return an error (``ncclCommAbort``); Gloo's would not wake it (a
        peer that left does). The group is re-formed before the next call."""
        _abort()

    def inject_failure(self, message: str) -> None:
        """Make this worker's next query or stream call raise :class:`InjectedFailure` as it starts,
        while its peers go on into the call's first collective (``Cluster.inject_failure``: a worker
        failing alone, for tests and demos)."""
        self._injected = message

    def _take_injected(self) -> None:
        message, self._injected = self._injected, None
        if message is not None:
            raise InjectedFailure(f"worker {self.index}: {message}")

    # -- regions --------------------------------------------------------------------------------
    def load_region(self, meta: dict, data: pa.Table) -> int:
        """Initial placement (the coordinator hands the rows over through Ray once)."""
        self._hold(R.RegionMeta.from_json(meta), data)
        return data.num_rows

    def _hold(self, meta: R.RegionMeta, data: pa.Table) -> None:
        self.meta[meta.id], self.data[meta.id] = meta, data
        self.schemas.setdefault(meta.table, data.schema)
        self._flow["bytes_written"] += R.table_bytes(data)
        self._flow["keys_written"] += data.num_rows
        self._tables.clear()

    def update_region(self, meta: dict) -> None:
        m = R.RegionMeta.from_json(meta)
        if m.id in self.data:
            self.meta[m.id] = m

    def drop_region(self, region_id: int) -> None:
        self.meta.pop(region_id, None)
        self.data.pop(region_id, None)
        self._tables.clear()

    def send_region(self, region_id: int, dst: int) -> int:
        """Send one region's snapshot to rank ``dst`` (which is in :meth:`recv_region`)."""
        wire = D.device()
        payload = torch.frombuffer(bytearray(R.to_ipc(self.data[region_id])), dtype=torch.uint8).to(wire)
        dist.send(torch.tensor([payload.numel()], dtype=torch.int64, device=wire), dst)
        dist.send(payload, dst)
        return int(payload.numel())

    def recv_region(self, meta: dict, src: int) -> int:
        wire = D.device()
        size = torch.zeros(1, dtype=torch.int64, device=wire)
        dist.recv(size, src)
        payload = torch.empty(int(size.item()), dtype=torch.uint8, device=wire)
        dist.recv(payload, src)
        self._hold(R.RegionMeta.from_json(meta), R.from_ipc(payload.cpu().numpy().tobytes()))
        return int(size.item())

    def split_region(self, region_id: int, left: dict, right: dict, partition_by: str | None, buckets: int) -> list[int]:
        """Split a replica in two (the SplitRegion step, on every replica alike): ``left`` keeps the
        region's id, ``right`` is the new region. Returns the rows of each half; an empty half (all
        the rows on one side of the hash bit: one key, say) leaves the replica as it was."""
        old = self.meta[region_id]
        low, high = R.split_half(self.data[region_id], partition_by, buckets, old.sub)
        if not low.num_rows or not high.num_rows:
            return [low.num_rows, high.num_rows]
        self.drop_region(region_id)
        for meta, part in ((left, low), (right, high)):
            m = R.RegionMeta.from_json(meta)
            self.meta[m.id], self.data[m.id] = m, part
        self._region_reads.pop(region_id, None)
        return [low.num_rows, high.num_rows]

    def held(self) -> dict[int, int]:
        """Region id -> rows of every replica this worker holds."""
        return {rid: t.num_rows for rid, t in self.data.items()}

    # -- heartbeats -----------------------------------------------------------------------------
    def store_heartbeat(self) -> dict:
        now = time.monotonic()
        span = max(now - self._last_hb, 1e-3)
        self._last_hb = now
        used = sum(R.table_bytes(t) for t in self.data.values())
        cap = _capacity(self.device)
        if self.device.type == "cuda":
            used = max(used, int(torch.cuda.memory_allocated(self.device)))
        flow = {k: int(v / span) for k, v in self._flow.items() if k != "queries"}  # per second
        hb = {"store_id": self.store_id, "capacity": cap, "available": max(cap - used, 0), "used_size": used,
              "region_count": len(self.data), "query_num": self._flow["queries"], **flow}
        self._flow = dict.fromkeys(self._flow, 0)
        return hb

    def region_heartbeats(self, down_stores=()) -> list[dict]:
        """The regions this worker leads, with what queries read of each per second since the last
        round (the load the split checker and the hot-region scheduler act on)."""
        now = time.monotonic()
        span = max(now - self._last_region_hb, 1e-3)
        self._last_region_hb = now
        reads, self._region_reads = self._region_reads, {}
        out = []
        for m in self.meta.values():
            if m.leader_store == self.store_id and m.id in self.data:
                b, k, q = reads.get(m.id, (0, 0, 0))
                out.append(m.heartbeat(down_stores, {"read_bytes": int(b / span), "read_keys": int(k / span),
                                                     "query_num": int(q / span)}))
        return out

    def execute(self, region_id: int, operator_id, step: dict) -> None:
        """``StepExecutor``: steps are collected and run by the coordinator between queries."""
        self._steps.append({"region_id": region_id, "operator_id": operator_id, "step": step})

    def heartbeat(self, down_stores=()) -> list[dict]:
        """One round of heartbeats; returns the steps the driver answered with."""
        down = set(down_stores)
        loop = HeartbeatLoop(self.client, self.store_heartbeat, lambda: self.region_heartbeats(down), self,
                             store_interval=0.0)
        self._steps = []
        loop.run_once()
        return self._steps

    # -- queries --------------------------------------------------------------------------------
    def _local_table(self, name: str, region_ids: list[int]):
        from opforge.sql.table import Table

        key = (name, tuple(region_ids))
        if key not in self._tables:
            parts = [self.data[r] for r in region_ids if self.data[r].num_rows]
            if parts:
                self._tables[key] = Table.from_partitions(parts, self.device)
            else:
                self._tables[key] = Table.from_arrow(self.schemas[name].empty_table(), self.device)
        return self._tables[key]

    def run_query(self, plan, leaders: dict[str, list[int]], options: dict, layouts: dict | None = None,
                  schemas: dict[str, pa.Schema] | None = None) -> dict:
        """This worker's part of a query over the regions it leads (``leaders``: table -> region ids).
        ``schemas``: of the tables scanned (a worker holding no region of one still scans it: no rows).
        Returns the rows it ends with (all of them on rank 0 when the result is replicated). Any
        error, its setup's included, leaves the group first (``_leaving_on_error``)."""
        return self._leaving_on_error(self._run_query, plan, leaders, options, layouts, schemas)

    def _run_query(self, plan, leaders, options, layouts, schemas) -> dict:
        self.schemas.update(schemas or {})
        from opforge.cluster.dist_executor import REPLICATED, DistributedExecutor
        from opforge.sql.physical.context import ExecContext

        missing = [r for rs in leaders.values() for r in rs if r not in self.data]
        if missing:
            raise RuntimeError(f"worker {self.index}: asked to lead regions {missing} it does not hold")
        t0 = time.perf_counter()
        tables = {name: self._local_table(name, rids) for name, rids in leaders.items()}
        for name, rids in leaders.items():
            for r in rids:
                size, rows = R.table_bytes(self.data[r]), self.data[r].num_rows
                self._flow["bytes_read"] += size
                self._flow["keys_read"] += rows
                acc = self._region_reads.setdefault(r, [0, 0, 0])
                acc[0], acc[1], acc[2] = acc[0] + size, acc[1] + rows, acc[2] + 1
        self._flow["queries"] += 1
        ex = DistributedExecutor(tables, self.device, ExecContext(**options), D.world_size(), layouts=layouts)
        batch, spread = ex.run_distributed(plan)
        rank = D.rank()
        result = None
        if spread != REPLICATED or rank == 0:
            result = pa.Table.from_arrays([batch.cols[o.cid].to_arrow() for o in plan.outputs],
                                          names=[o.name for o in plan.outputs])
        return {"rank": rank, "result": result, "rows": batch.n, "ms": (time.perf_counter() - t0) * 1e3,
                "exchanges": ex.stats}

    # -- stream jobs (``stream_job.py`` drives them, ``stream_task.py`` runs them) -------------------
    def stream_open(self, spec: dict, transformations: list) -> None:
        """This worker's part of a stream job: its subtasks, restored from its replicas."""
        from opforge.cluster.stream_task import StreamTask

        self.stream_close()
        self._stream = self._leaving_on_error(StreamTask, self, spec, transformations)

    def stream_call(self, method: str, *args):
        """``round``, ``finish``, ``snapshot`` or ``commit`` of the open stream job (collectives)."""
        return self._leaving_on_error(self._stream_call, method, *args)

    def _stream_call(self, method: str, *args):
        task = getattr(self, "_stream", None)
        if task is None:  # e.g. a process Ray restarted: the coordinator restores the job
            raise RuntimeError(f"worker {self.index}: no stream job is open here")
        if method not in ("round", "finish", "snapshot", "commit"):
            raise ValueError(f"worker {self.index}: unknown stream call {method!r}")
        return getattr(task, method)(*args)

    def stream_close(self) -> None:
        task, self._stream = getattr(self, "_stream", None), None
        if task is not None:
            task.close()

    def _leaving_on_error(self, fn, *args):
        """Leave the group when a call fails: peers waiting on this rank fail now, not at the group's
        timeout (a rank blocked on a survivor of a failed peer fails in turn, and leaves too). The
        coordinator re-forms the group before the next call."""
        try:
            self._take_injected()
            return fn(*args)
        except BaseException:
            self.leave_group()
            raise


def _abort() -> None:
    """Abort the default group, if any (``ncclCommAbort``: never waits on peers)."""
    try:
        if dist.is_initialized():
            distributed_c10d._abort_process_group()
    except (ValueError, AssertionError):  # the other thread (task or control) aborted it meanwhile
        pass


class InjectedFailure(RuntimeError):
    """The failure :meth:`Worker.inject_failure` set up."""


def _node_ip() -> str:
    try:
        import ray

        return ray.util.get_node_ip_address()
    except Exception:  # outside Ray (a test driving the class in-process)
        return "127.0.0.1"

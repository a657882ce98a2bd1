"""A worker's part of a stream job on the cluster (``stream_job.py`` drives it through Ray).

The job's keyed state is cut into ``R`` key-group ranges, one region each (``keyed parallelism ==
R``: subtask ``i`` of a keyed operator owns ``rescale.key_group_range(i, R)``). Subtask ``i`` of
*every* operator (sources and stateless ones too) belongs to region ``i % R`` and runs on the worker
that leads that region, so a forward edge never leaves a worker, and the region's replica holds all
the state of the subtasks it carries.

Each worker builds the whole job graph with the single-process engine's pieces
(``stream.executor``: runners, edges, partitioners, operators), with only its own subtasks real.
An edge that is not forward (``key_by``, rebalance, broadcast, ...) does not call the downstream
subtask: it posts the batch, watermark or idleness change, keyed by its place in the single-process
engine's depth-first order (``post``). After the round's polls the workers exchange what they
posted over the process group (``stream_wire.exchange_bytes``) and each delivers, in key order, what
its subtasks received, until nothing is in flight on any worker. So every subtask sees its input in
the order the single-process engine gives it. A job with operators of two or more inputs (unions,
connected streams, joins) steps through its source subtasks one poll at a time instead, each poll
delivered and then the merging operators flushed (``StreamTask._poll_one_by_one``), as that engine
does after every poll.

A checkpoint is taken between rounds, when nothing is in flight (aligned barriers, as in
``stream/checkpoint.py``): each worker snapshots the subtasks of the regions it leads, one blob per
region (the state tree as JSON, tensors as Arrow IPC: no pickle), sends each blob to the region's
followers over the group, and every replica keeps it in its copy of the region (rows
``checkpoint_id, state``). The sinks' output since the last checkpoint goes back to the coordinator
with the acknowledgement; it commits the output once every worker has acked (exactly once). A new
leader restores its regions from its own replica.
"""
from __future__ import annotations

import json
from types import SimpleNamespace

import pyarrow as pa
import torch

import opforge.distributed as D
from opforge.cluster import regions as R
from opforge.cluster import stream_wire as wire
from opforge.cluster.errors import ClusterError
from opforge.stream.checkpoint import StateEncoder, decode, tensors_of_table, tensors_table
from opforge.stream.coordinator import _restore_source, _source_state, operator_uids
from opforge.stream.executor import (_attributed, _Node, _Runner, _SourceRunner, build_operator,
                                     connect_edges)
from opforge.stream.operator_state import restore_operator, snapshot_operator
from opforge.stream.partitioning import ForwardPartitioner, key_group_targets
from opforge.stream.sinks import Sink
from opforge.stream.sources import positioned

_KEYS = "__keys__"  # in a region's state tree: the values of its non-int keys (``StreamTask._key_codecs``)
STATE_SCHEMA = pa.schema([("checkpoint_id", pa.int64()), ("state", pa.large_binary())])


def initial_state(regions: int) -> pa.Table:
    """The rows a job's regions start with: checkpoint 0, no state (a fresh start)."""
    return pa.table({"checkpoint_id": [0] * regions, "state": [b""] * regions}, schema=STATE_SCHEMA)


class _DrivenClock:
    """Processing time as the coordinator's clock gave it for this round."""

    def __init__(self, now: int):
        self._now = now

    def now(self) -> int:
        return self._now

    def tick(self) -> None:
        pass


class StagedSink(Sink):
    """A sink subtask on a worker: output waits here for the next checkpoint, which hands it to the
    coordinator; the coordinator writes it to the job's sink once every region has acked."""

    def __init__(self):
        self.pending: list = []

    def write(self, batch, subtask):
        if len(batch):
            self.pending.append(batch)


class _Elsewhere:
    """A subtask another worker runs, on an edge that never reaches it from here (forward)."""

    def __init__(self):
        self.out = SimpleNamespace(edges=[])

    def add_channel(self, ch) -> None:
        pass


class _Posted:
    """A subtask behind an edge that is not forward: what reaches it is posted, delivered in the
    round's exchange (``StreamTask.drain``), on this worker or another."""

    def __init__(self, task: "StreamTask", node: _Node, index: int, host: int, local):
        self.task, self.node_id, self.index, self.host, self.local = task, node.t.id, index, host, local
        self.keys = [inp.key for inp in node.t.inputs]  # per input: a join's inputs have one selector each
        self.out = local.out if local is not None else SimpleNamespace(edges=[])

    def add_channel(self, ch) -> None:
        if self.local is not None:
            self.local.add_channel(ch)

    def _post(self, header: dict, batch=None) -> None:
        self.task.post(self.host, {"n": self.node_id, "s": self.index, **header}, batch)

    def receive(self, batch, ch, input_index: int = 0) -> None:
        key = self.keys[input_index]
        local = key.codec.local if key is not None else None
        if local is not None:
            raise TypeError(f"key_by on a cluster: key {local!r} is a {type(local).__name__}; keys that cross "
                            "workers are ints, floats, strings, bytes, bools, None or tuples of those (their ids "
                            "hash the value, the same on every worker)")
        self._post({"k": "b", "c": list(ch), "i": input_index}, batch)

    def receive_watermark(self, wm: int, ch) -> None:
        self._post({"k": "w", "c": list(ch), "w": int(wm)})

    def receive_idle(self, ch, idle: bool) -> None:
        self._post({"k": "i", "c": list(ch), "v": bool(idle)})


def _forward(inp, t) -> bool:
    p = inp.partitioner
    return isinstance(p, ForwardPartitioner) or (p is None and inp.upstream.parallelism == t.parallelism)


class StreamTask:
    """``spec``: ``regions`` (per key-group range: ``id``, ``leader`` and ``followers`` worker
    ranks), ``device`` (the job's: where the records' columns live; the group's backend moves
    them), ``now``, ``batch_size``, ``watermark_granularity`` and ``restore`` (the checkpoint id to
    start from; 0: a fresh start)."""

    def __init__(self, worker, spec: dict, transformations: list):
        self.worker = worker
        self.rank, self.world = D.rank(), D.world_size()
        self.device = _device(spec["device"], worker.index)
        self.regions = spec["regions"]
        self.clock = _DrivenClock(spec["now"])
        self.env = SimpleNamespace(device=self.device, batch_size=spec["batch_size"], clock=self.clock,
                                   watermark_granularity=spec["watermark_granularity"], state_budget=None)
        self.transformations = transformations
        self.uids = operator_uids(transformations)
        self.outbox: list[list] = [[] for _ in range(self.world)]
        self.cause, self.counter = (0, 0, 0), 0  # what is being processed, and what it posted so far
        self.exchanged = {"bytes": 0, "records": 0}  # what this worker sent to others over the group
        self._build()
        for order, t in self._operators():
            for r in self.local[t.id].values():
                with _attributed(r.op):
                    r.op.open()
        self._restore(spec["restore"])

    def host(self, subtask: int) -> int:
        return self.regions[subtask % len(self.regions)]["leader"]

    # -- the graph ------------------------------------------------------------------------------
    def _build(self) -> None:
        nodes = {t.id: _Node(t) for t in self.transformations}
        self.inputs_of = {t.id: t.inputs for t in self.transformations}
        self.nodes, self.local, self.sources = nodes, {}, []
        self.all_sources = [(order, i) for order, t in enumerate(self.transformations) if t.kind == "source"
                            for i in range(t.parallelism)]
        self.merging = [(order, t) for order, t in enumerate(self.transformations) if len(t.inputs) > 1]
        for order, t in enumerate(self.transformations):
            node = nodes[t.id]
            mine = [i for i in range(t.parallelism) if self.host(i) == self.rank]
            if t.kind == "source":
                splits = t.params["source"].splits(t.parallelism, self.env.batch_size, self.device)
                real = {i: _SourceRunner(node, i, positioned(splits[i]), self.env, node.metrics[i]) for i in mine}
                node.runners = [real.get(i) or _Elsewhere() for i in range(t.parallelism)]
                self.sources += [(order, i, r) for i, r in real.items()]
                self.local[t.id] = real
                continue
            key = next((inp.key for inp in t.inputs if inp.key is not None), None)
            real = {}
            for i in mine:
                op = build_operator(t, key)
                if t.kind == "sink":
                    op.sink = StagedSink()
                op.setup(None, i, t.parallelism, self.clock, self.device)
                op.state_budget = None
                real[i] = _Runner(node, i, op, node.metrics[i])
                op.out = real[i].out
            self.local[t.id] = real
            if all(_forward(inp, t) for inp in t.inputs):
                node.runners = [real.get(i) or _Elsewhere() for i in range(t.parallelism)]
            else:
                node.runners = [_Posted(self, node, i, self.host(i), real.get(i)) for i in range(t.parallelism)]
        connect_edges(self.transformations, nodes)  # a _Posted subtask: its edges on the local runner

    def _operators(self):
        return [(order, t) for order, t in enumerate(self.transformations) if t.kind != "source"]

    # -- rounds ---------------------------------------------------------------------------------
    def post(self, host: int, header: dict, batch=None) -> None:
        """Send ``header`` (and ``batch``) to a subtask on worker ``host`` (this one too). Its order
        key is that of what is being processed (a source poll or a timer round: ``(1 or 0, operator,
        subtask)``; a delivered message: its key), then the number of messages that posted before:
        sorted by key, every subtask gets its messages in the depth-first order of the single-process
        engine (a poll's records go all the way down before the next poll), however many hops."""
        header["o"] = [*self.cause, self.counter]
        self.counter += 1
        self.outbox[host].append((header, batch))

    def round(self, now: int) -> dict:
        """Fire processing-time timers, poll this worker's source subtasks once, deliver. Collective."""
        self.clock._now = now
        for order, t in self._operators():
            for i, r in sorted(self.local[t.id].items()):
                self.cause, self.counter = (0, order, i), 0
                with _attributed(r.op):
                    r.op.on_processing_time(now)
        before = self._emitted()
        if self.merging:
            self._poll_one_by_one(now)
        else:
            for order, i, s in self.sources:
                if not s.finished:
                    self.cause, self.counter = (1, order, i), 0
                    s.poll(now)
            self.drain()
        return {"finished": all(s.finished for _, _, s in self.sources), "records": self._emitted() - before}

    def _poll_one_by_one(self, now: int) -> None:
        """A job with operators of two or more inputs (union, connect, joins): as in the
        single-process engine, each source subtask's poll goes all the way through the graph (every
        worker delivers it) and then the merging operators run what they held (``_Runner.flush``:
        their inputs' records in watermark order), before the next subtask polls. Collective: every
        worker steps through the job's unfinished source subtasks in graph order."""
        mine = {(order, i): s for order, i, s in self.sources}
        finished = wire.any_of([at in mine and mine[at].finished for at in self.all_sources])
        for (order, i), done in zip(self.all_sources, finished):
            if done:
                continue
            s = mine.get((order, i))
            if s is not None:
                self.cause, self.counter = (1, order, i), 0
                s.poll(now)
            self.drain()
            self.flush()

    def flush(self) -> None:
        """Run what the merging operators held, in graph order (what one emits may reach a later
        one), delivering each one's output before the next flushes. Collective."""
        for order, t in self.merging:
            for i, r in sorted(self.local[t.id].items()):
                self.cause, self.counter = (2, order, i), 0
                r.flush()
            self.drain()

    def _emitted(self) -> int:
        return sum(s.metrics.records_out for _, _, s in self.sources)

    def finish(self) -> dict:
        """The end of the input: operators finish, what they emit is delivered. Collective. Returns
        this worker's counters: per operator (graph order) its subtasks' records in / out, batches
        and busy ms, and what it sent over the group."""
        for _, t in self._operators():
            for r in self.local[t.id].values():
                with _attributed(r.op):
                    r.op.finish()
        self.drain()
        metrics = {order: [[m.records_in, m.records_out, m.batches_in, m.busy_ms]
                           for m in (r.metrics for r in self.local[t.id].values())]
                   for order, t in enumerate(self.transformations)}
        return {"metrics": metrics, "exchanged": dict(self.exchanged)}

    def drain(self) -> None:
        """Exchange and deliver posted messages until none is in flight on any worker. Collective."""
        while wire.any_pending(sum(map(len, self.outbox))):
            boxes, self.outbox = self.outbox, [[] for _ in range(self.world)]
            outgoing = [b"" if d == self.rank else
                        wire.pack([(h, b"" if b is None else wire.encode_batch(b)) for h, b in box])
                        for d, box in enumerate(boxes)]
            got = wire.exchange_bytes(outgoing)
            self.exchanged["bytes"] += sum(map(len, outgoing))
            self.exchanged["records"] += sum(len(b) for d, box in enumerate(boxes) if d != self.rank
                                             for _, b in box if b is not None)
            inbox = [(tuple(h["o"]), h, b) for h, b in boxes[self.rank]]
            for src, data in enumerate(got):
                if src != self.rank:
                    inbox += [(tuple(h["o"]), h,
                               wire.decode_batch(body, self.device) if h["k"] == "b" else None)
                              for h, body in wire.unpack(data)]
            inbox.sort(key=lambda m: m[0])  # the single-process engine's order (``post``)
            for cause, h, batch in inbox:
                self.cause, self.counter = cause, 0
                r, ch = self.local[h["n"]][h["s"]], tuple(h["c"])
                if h["k"] == "b":
                    r.receive(self._keyed(batch, h), ch, h["i"])
                elif h["k"] == "w":
                    r.receive_watermark(h["w"], ch)
                else:
                    r.receive_idle(ch, h["v"])

    def _keyed(self, batch, header: dict):
        """A batch for a keyed input, its key ids checked against this worker's key selector, which
        also learns the keys' values (to decode ids) from the records."""
        key = self.inputs_of[header["n"]][header["i"]].key
        if key is None or batch.keys is None:
            return batch
        if not torch.equal(key.key_ids(batch), batch.keys):
            raise ClusterError(f"key_by on a cluster: worker {self.rank} derives other key ids from the records "
                               "than the worker that sent them; a key selector must give the same keys in every "
                               "process (no Python hash(), id() or randomness)")
        return batch

    # -- checkpoints ----------------------------------------------------------------------------
    def snapshot(self, checkpoint_id: int) -> dict:
        """Snapshot the regions this worker leads, replicate each to its followers, keep them.
        Returns the sinks' output since the last checkpoint (Arrow IPC per batch). Collective."""
        trees: dict[int, dict] = {}
        for order, t in enumerate(self.transformations):
            uid = self.uids[order]
            for i, r in self.local[t.id].items():
                state = _source_state(r) if t.kind == "source" else \
                    {"channels": [[e, u, w, r.idle[(e, u)]] for (e, u), w in r.wms.items()], "current": r.current,
                     "out_idle": r.out_idle, "operator": snapshot_operator(r.op, checkpoint_id)}
                m = r.metrics  # counters restore too: a job's totals count each record once
                state["metrics"] = [m.records_in, m.records_out, m.batches_in, m.busy_ms]
                trees.setdefault(i % len(self.regions), {}).setdefault(uid, {})[str(i)] = state
        for index, tree in trees.items():
            tree[_KEYS] = self._key_codecs(index)
        blobs = {index: _encode_region(tree, index) for index, tree in trees.items()}
        outgoing: list[list] = [[] for _ in range(self.world)]
        for index, blob in blobs.items():
            for d in self.regions[index]["followers"]:
                outgoing[d].append(({"r": index}, blob))
        got = wire.exchange_bytes([wire.pack(box) for box in outgoing])
        for index, blob in blobs.items():
            self._keep(index, checkpoint_id, blob)
        for data in got:
            for h, blob in wire.unpack(data):
                self._keep(h["r"], checkpoint_id, blob)
        output = []
        for order, t in enumerate(self.transformations):
            if t.kind == "sink":
                for i, r in sorted(self.local[t.id].items()):
                    output += [[order, i, wire.encode_batch(b)] for b in r.op.sink.pending]
                    r.op.sink.pending = []
        return {"output": output}

    def _key_codecs(self, index: int) -> list:
        """The values of the non-int keys of key-group range ``index`` (this worker's codecs know
        them), per keyed input ``[uid, input index, ids, values]``: a new leader decodes its restored
        state's key ids with them."""
        out = []
        for uid, t in zip(self.uids, self.transformations):
            for i, inp in enumerate(t.inputs):
                if inp.key is None or inp.key.identity is not False:
                    continue
                ids, values = inp.key.codec.state()
                if ids:
                    mine = (key_group_targets(torch.tensor(ids, dtype=torch.int64), len(self.regions)) == index).tolist()
                    ids, values = [k for k, m in zip(ids, mine) if m], [v for v, m in zip(values, mine) if m]
                out.append([uid, i, ids, values])
        return out

    def _keep(self, index: int, checkpoint_id: int, blob: bytes) -> None:
        rid = self.regions[index]["id"]
        held = self.worker.data.get(rid)
        if held is None:
            raise ClusterError(f"worker {self.rank}: asked to keep a checkpoint of region {rid} it holds no "
                               "replica of")
        row = pa.table({"checkpoint_id": [checkpoint_id], "state": [blob]}, schema=STATE_SCHEMA)
        meta = self.worker.meta[rid]
        meta.bytes = len(blob)  # the region's size in its heartbeats: its state's
        self.worker._hold(meta, pa.concat_tables([held, row]))

    def commit(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` completed: the replicas here drop the older ones."""
        for region in self.regions:
            held = self.worker.data.get(region["id"])
            if held is not None:
                ids = held.column("checkpoint_id").to_pylist()
                keep = [j for j, c in enumerate(ids) if c >= checkpoint_id]
                self.worker._hold(self.worker.meta[region["id"]], held.take(pa.array(keep, pa.int64())))

    def _restore(self, checkpoint_id: int) -> None:
        """Put the subtasks of the regions this worker leads back into checkpoint ``checkpoint_id``,
        from this worker's replicas (0: a fresh start)."""
        if checkpoint_id == 0:
            return
        by_uid = {uid: t for uid, t in zip(self.uids, self.transformations)}
        for index, region in enumerate(self.regions):
            if region["leader"] != self.rank:
                continue
            held = self.worker.data.get(region["id"])
            ids = [] if held is None else held.column("checkpoint_id").to_pylist()
            if checkpoint_id not in ids:
                raise ClusterError(f"worker {self.rank}: region {region['id']} (key-group range {index}) has no "
                                   f"copy of checkpoint {checkpoint_id} here (it holds {ids})")
            tree = _decode_region(held.column("state")[ids.index(checkpoint_id)].as_py(), self.device)
            for uid, i, key_ids, values in tree.pop(_KEYS, []):
                key = by_uid[uid].inputs[i].key
                key.space.identity = False
                key.codec.learn(key_ids, values)
            for uid, subtasks in tree.items():
                t = by_uid[uid]
                for i, s in subtasks.items():
                    r = self.local[t.id][int(i)]
                    m = r.metrics
                    m.records_in, m.records_out, m.batches_in, m.busy_ms = s["metrics"]
                    if t.kind == "source":
                        _restore_source(r, s, self.clock)
                        continue
                    for e, u, w, idle in s["channels"]:
                        r.wms[(e, u)], r.idle[(e, u)] = w, idle
                    r.current, r.out_idle = s["current"], s["out_idle"]
                    restore_operator(r.op, s["operator"])

    def close(self) -> None:
        for _, t in self._operators():
            for r in self.local[t.id].values():
                dispose = getattr(r.op, "dispose", None)
                if callable(dispose):
                    dispose()


def _device(name: str, worker: int):
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"stream on a cluster: the job's device is {name} but worker {worker} sees no GPU; on a "
                         "Gloo cluster with more workers than GPUs, start it with env={'RAY_EXPERIMENTAL_NOSET_"
                         "CUDA_VISIBLE_DEVICES': '1'} so that the workers share the GPUs")
    return device


def _encode_region(tree: dict, index: int) -> bytes:
    """One region's subtask states: the tree as tagged JSON in the metadata of the Arrow table of its
    tensors (``stream/checkpoint.py``'s codec)."""
    enc = StateEncoder()
    encoded = enc.encode(tree, f"the stream state of key-group range {index}")
    table = tensors_table(enc.tensors).replace_schema_metadata({"state": json.dumps(encoded, separators=(",", ":"))})
    return R.to_ipc(table)


def _decode_region(blob: bytes, device) -> dict:
    table = R.from_ipc(blob)
    return decode(json.loads(table.schema.metadata[b"state"]), tensors_of_table(table, device))

"""The true cluster the driver tries to manage.

``SimulatedCluster`` owns the ground truth: every region (key range, epoch,
peers and roles, leader, size, flows) and every store (a ``Node``). Each
``step()`` is one tick (one simulated second):

1. the loads run (write/read flows feed store traffic; an import grows the
   region that holds its key);
2. every live node applies the tasks that are due (``node.apply_step``);
3. snapshots progress; a finished one makes its peer a full replica;
4. regions whose leader's store is down elect a new leader among the live
   voters once ``election_ticks`` have passed, if a quorum of the voters is
   alive (both halves of a joint configuration);
5. live nodes send store heartbeats every ``store_hb_interval`` ticks;
6. region leaders send heartbeats: at once after a change, every
   ``region_hb_interval`` ticks otherwise, and every tick while the driver
   has an operator on the region (the driver's push stream, as PD sends each
   new operator's step through the heartbeat stream right away); the answer's
   step goes to the node that sent the heartbeat;
7. the driver ticks (checkers and schedulers), on the simulated clock.

Faults: heartbeats (region and store) are dropped with ``hb_drop_prob`` or
delivered again a little later (``hb_dup_prob``: a stale duplicate); steps
received by a leader are dropped with ``step_drop_prob`` (the leader simply
ignores them) or run twice (``step_dup_prob``); stores can go down, come
back, and be slow.

Every membership change is checked: one that takes a region from "a majority
of its voters on live stores" to "not" is recorded in ``quorum_violations``
(under joint consensus, both configurations need their majority).

Keys are bytes; the initial regions cut the space of 8-byte keys evenly, the
first starting at ``b""`` and the last ending at ``b""`` (= +infinity).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable

from opforge.placement.cluster import Peer, PeerRole, Region, RegionEpoch, Store, StoreState
from opforge.placement.heartbeat import HeartbeatError, RegionHeartbeat, StoreHeartbeat
from opforge.placement.operator.step import RemovePeer
from opforge.placement.simulator.node import MIB, Node, SnapshotJob, Task, apply_step

KEY_BYTES = 8
KEY_SPACE = 1 << (8 * KEY_BYTES)


def encode_key(pos: int) -> bytes:
    """The key at integer position ``pos`` of the 8-byte key space (0 -> b"")."""
    if pos <= 0:
        return b""
    return pos.to_bytes(KEY_BYTES, "big")


def _key_int(key: bytes, width: int, is_end: bool) -> int:
    if key == b"":
        return (1 << (8 * width)) if is_end else 0
    return int.from_bytes(key.ljust(width, b"\0"), "big")


def middle_key(start: bytes, end: bytes) -> bytes | None:
    """A key strictly between ``start`` and ``end`` (``end`` b"" = +inf), or None."""
    width = max(len(start), len(end), KEY_BYTES)
    for w in (width, width + 1, width + 2):
        lo, hi = _key_int(start, w, False), _key_int(end, w, True)
        mid = (lo + hi) // 2
        if lo < mid < hi:
            key = mid.to_bytes(w, "big")
            if start < key and (end == b"" or key < end):
                return key
    return None


def key_in(key: bytes, start: bytes, end: bytes) -> bool:
    return start <= key and (end == b"" or key < end)


class SimRegion:
    """One region as it truly is."""

    __slots__ = ("id", "start", "end", "conf_ver", "version", "peers", "leader_id", "size", "keys",
                 "write_rate", "read_rate", "write_keys_rate", "read_keys_rate", "query_rate", "pending",
                 "import_rate", "import_keys_rate", "leader_lost_at", "last_hb")

    def __init__(self, rid: int, start: bytes, end: bytes, peers: tuple[Peer, ...], leader_id: int | None,
                 size: float, keys: int = 0, conf_ver: int = 1, version: int = 1):
        self.id = rid
        self.start, self.end = start, end
        self.conf_ver, self.version = conf_ver, version
        self.peers = peers
        self.leader_id = leader_id
        self.size = float(size)  # MiB
        self.keys = keys
        self.write_rate = self.read_rate = 0.0  # bytes per second
        self.write_keys_rate = self.read_keys_rate = self.query_rate = 0.0
        self.import_rate = self.import_keys_rate = 0.0  # this tick's import writes (not inherited by splits)
        self.pending: set[int] = set()  # peer ids still receiving their snapshot
        self.leader_lost_at: float | None = None
        self.last_hb = -1.0

    @property
    def leader(self) -> Peer | None:
        for p in self.peers:
            if p.id == self.leader_id:
                return p
        return None

    def peer_on(self, store_id: int) -> Peer | None:
        for p in self.peers:
            if p.store_id == store_id:
                return p
        return None

    @property
    def in_joint_state(self) -> bool:
        return any(p.role in (PeerRole.INCOMING_VOTER, PeerRole.DEMOTING_VOTER) for p in self.peers)

    def voters(self) -> list[Peer]:
        return [p for p in self.peers if p.is_voter]

    def __repr__(self) -> str:
        peers = ",".join(f"{p.store_id}{'*' if p.id == self.leader_id else ''}"
                         f"{'' if p.role == PeerRole.VOTER else p.role.value[0]}" for p in self.peers)
        return (f"SimRegion({self.id} [{self.start.hex()},{self.end.hex()}) v{self.conf_ver}/{self.version} "
                f"{peers} {self.size:.0f}MiB)")


def quorum_ok(peers, alive: Callable[[int], bool]) -> bool:
    """A majority of the voters on live stores (each half of a joint config)."""
    incoming = [p for p in peers if p.role in (PeerRole.VOTER, PeerRole.INCOMING_VOTER)]
    outgoing = [p for p in peers if p.role in (PeerRole.VOTER, PeerRole.DEMOTING_VOTER)]
    for conf in (incoming, outgoing):
        if not conf:
            return False
        if 2 * sum(1 for p in conf if alive(p.store_id)) <= len(conf):
            return False
    return True


@dataclass
class SimConfig:
    """How the simulated workers behave (timings in ticks; a tick is one second)."""

    region_hb_interval: int = 10
    store_hb_interval: int = 5
    fast_step_ticks: float = 1.0
    split_merge_ticks: float = 1.0
    election_ticks: int = 2
    peer_down_after: int = 5  # a leader reports a peer down after its store is silent this long
    push_operators: bool = True  # heartbeat every tick while the driver has an operator on the region
    # faults
    step_drop_prob: float = 0.0
    step_dup_prob: float = 0.0
    hb_drop_prob: float = 0.0
    hb_dup_prob: float = 0.0
    # checks
    check_coverage: bool = False  # verify every tick that the regions tile the key space


@dataclass
class MembershipRecord:
    tick: float
    region_id: int
    step: str
    operator_id: int | None
    before: tuple
    after: tuple


@dataclass
class Move:
    tick: float
    region_id: int
    from_store: int
    to_store: int
    operator_id: int | None
    kind: str  # "peer" | "leader"


@dataclass
class Flow:
    """Constant flows (per second) on a set of regions; splits share them out."""

    write_bytes: float = 0.0
    read_bytes: float = 0.0
    write_keys: float = 0.0
    read_keys: float = 0.0
    query: float = 0.0


@dataclass
class ImportSpot:
    """Data written at one key: the region holding it grows ``mib_per_tick``."""

    key: bytes
    mib_per_tick: float
    until: float = float("inf")
    keys_per_mib: int = 10_000


@dataclass
class _Replay:
    at: float
    kind: str  # "region" | "store"
    payload: object
    sender: int


class SimulatedCluster:
    def __init__(self, driver, config: SimConfig | None = None, seed: int = 0):
        self.driver = driver
        self.config = config or SimConfig()
        self.rng = random.Random(seed ^ 0x5EED)
        self.now = 0.0
        self.nodes: dict[int, Node] = {}
        self.regions: dict[int, SimRegion] = {}
        self.imports: list[ImportSpot] = []
        self._import_touched: set[int] = set()
        self.dirty: set[int] = set()  # regions whose leader heartbeats at the end of this tick
        self._leaderless: set[int] = set()
        self._replays: list[_Replay] = []
        # per-store true figures, kept up to date incrementally
        self._leaders: dict[int, int] = {}
        self._peers: dict[int, int] = {}
        self._size: dict[int, float] = {}
        self._leader_size: dict[int, float] = {}
        # records
        self.membership_log: list[MembershipRecord] = []
        self.quorum_violations: list[MembershipRecord] = []
        self.coverage_errors: list[str] = []
        self.moves: list[Move] = []
        self.reversed_moves: list[tuple[Move, Move]] = []
        self._move_seen: dict[tuple[int, str], dict[tuple[int, int], Move]] = {}
        self._op_adds: dict[int, list[tuple[int, int]]] = {}  # operator id -> [(region, to_store)]
        self.snapshot_mib = 0.0  # data copied by finished snapshots
        self.snapshots_done = 0
        self.steps_received = 0
        self.steps_dropped = 0  # by fault injection
        self.steps_rejected: dict[str, int] = {}  # by the leader: reason -> count
        self.steps_applied: dict[str, int] = {}
        self.heartbeats_sent = 0
        self.heartbeats_refused = 0  # the driver refused (stale, unknown store...)
        self.splits = 0
        self.merges = 0
        self.elections = 0

    # ------------------------------------------------------------------ setup
    def add_node(self, node: Node) -> Node:
        if node.id in self.nodes:
            raise ValueError(f"store {node.id} already exists")
        self.nodes[node.id] = node
        for index in (self._leaders, self._peers):
            index.setdefault(node.id, 0)
        self._size.setdefault(node.id, 0.0)
        self._leader_size.setdefault(node.id, 0.0)
        node.last_store_hb = self.now
        self.driver.put_store(Store(id=node.id, address=node.address, labels=dict(node.labels),
                                    capacity=node.capacity, available=node.capacity))
        self._send_store_heartbeat(node)
        return node

    def add_region(self, region: SimRegion) -> None:
        self.regions[region.id] = region
        self._index(region)
        self.dirty.add(region.id)

    def new_id(self) -> int:
        """A fresh id for a region or peer, from the driver's allocator (PD's AllocID)."""
        return self.driver.ids()

    # ------------------------------------------------------------------ queries
    def is_alive(self, store_id: int) -> bool:
        n = self.nodes.get(store_id)
        return n is not None and n.alive and not n.removed

    def up_store_ids(self) -> list[int]:
        """Stores that are alive and not being removed (offline/tombstone in the driver)."""
        out = []
        for sid, n in self.nodes.items():
            if not n.alive or n.removed:
                continue
            s = self.driver.cluster.get_store(sid)
            if s is not None and s.state != StoreState.UP:
                continue
            out.append(sid)
        return sorted(out)

    def leader_count(self, store_id: int) -> int:
        return self._leaders.get(store_id, 0)

    def peer_count(self, store_id: int) -> int:
        return self._peers.get(store_id, 0)

    def used_mib(self, store_id: int) -> float:
        return self._size.get(store_id, 0.0)

    def leader_mib(self, store_id: int) -> float:
        return self._leader_size.get(store_id, 0.0)

    def sending_snapshots(self, store_id: int) -> int:
        return sum(1 for n in self.nodes.values() for j in n.receiving if j.from_store == store_id)

    def snapshot_wanted(self, job: SnapshotJob) -> bool:
        r = self.regions.get(job.region_id)
        if r is None or job.peer_id not in r.pending:
            return False
        p = r.peer_on(job.to_store)
        return p is not None and p.id == job.peer_id

    def snapshot_source_alive(self, job: SnapshotJob) -> bool:
        r = self.regions.get(job.region_id)
        return r is not None and r.leader is not None and self.is_alive(r.leader.store_id)

    def sorted_regions(self) -> list[SimRegion]:
        return sorted(self.regions.values(), key=lambda r: r.start)

    def region_at(self, key: bytes) -> SimRegion | None:
        for r in self.regions.values():
            if key_in(key, r.start, r.end):
                return r
        return None

    def coverage_error(self) -> str | None:
        """Why the regions do not tile the key space exactly (None when they do)."""
        rs = self.sorted_regions()
        if not rs:
            return "no regions"
        if rs[0].start != b"":
            return f"key space before {rs[0].start.hex()} is not covered"
        for a, b in zip(rs, rs[1:]):
            if a.end != b.start:
                kind = "gap" if a.end != b"" and a.end < b.start else "overlap"
                return f"{kind} between region {a.id} (ends {a.end.hex()}) and {b.id} (starts {b.start.hex()})"
        if rs[-1].end != b"":
            return f"key space after {rs[-1].end.hex()} is not covered"
        return None

    # ------------------------------------------------------------------ indexes
    def _index(self, r: SimRegion, sign: int = 1) -> None:
        for p in r.peers:
            self._peers[p.store_id] = self._peers.get(p.store_id, 0) + sign
            self._size[p.store_id] = self._size.get(p.store_id, 0.0) + sign * r.size
        lead = r.leader
        if lead is not None:
            self._leaders[lead.store_id] = self._leaders.get(lead.store_id, 0) + sign
            self._leader_size[lead.store_id] = self._leader_size.get(lead.store_id, 0.0) + sign * r.size

    def _unindex(self, r: SimRegion) -> None:
        self._index(r, -1)

    # ------------------------------------------------------------------ changes (called by node.apply_step)
    def set_leader(self, region: SimRegion, peer: Peer, cause: Task | None) -> None:
        old = region.leader
        self._unindex(region)
        region.leader_id = peer.id
        region.leader_lost_at = None
        self._index(region)
        self._leaderless.discard(region.id)
        self.dirty.add(region.id)
        if cause is not None and old is not None:
            self._record_move(region.id, old.store_id, peer.store_id, cause.operator_id, "leader")

    def change_membership(self, region: SimRegion, peers: tuple[Peer, ...], cause: Task) -> None:
        before = quorum_ok(region.peers, self.is_alive)
        old_peers = region.peers
        self._unindex(region)
        region.peers = tuple(peers)
        region.conf_ver += 1
        ids = {p.id for p in peers}
        region.pending &= ids
        self._index(region)
        self.dirty.add(region.id)
        after = quorum_ok(region.peers, self.is_alive)
        rec = MembershipRecord(self.now, region.id, type(cause.step).__name__, cause.operator_id,
                               tuple((p.store_id, p.role.value) for p in old_peers),
                               tuple((p.store_id, p.role.value) for p in peers))
        if len(self.membership_log) < 200_000:
            self.membership_log.append(rec)
        if before and not after:
            self.quorum_violations.append(rec)
        # removed peers: stop their snapshots, and pair them with an add of the same operator (a move)
        for p in old_peers:
            if p.id not in ids:
                node = self.nodes.get(p.store_id)
                if node is not None:
                    node.drop_snapshots_of(region.id, p.id)
                if isinstance(cause.step, RemovePeer) and cause.operator_id is not None:
                    for rid, to in self._op_adds.get(cause.operator_id, ()):
                        if rid == region.id:
                            self._record_move(region.id, p.store_id, to, cause.operator_id, "peer")
                            break

    def start_snapshot(self, region: SimRegion, peer: Peer, cause: Task) -> None:
        region.pending.add(peer.id)
        if cause.operator_id is not None:
            self._op_adds.setdefault(cause.operator_id, []).append((region.id, peer.store_id))
        leader = region.leader
        job = SnapshotJob(region.id, peer.id, leader.store_id if leader else 0, peer.store_id,
                          max(region.size, 1.0), max(region.size, 1.0), cause.operator_id)
        self.nodes[peer.store_id].enqueue_snapshot(job)

    def split_region(self, region: SimRegion, keys: tuple[bytes, ...], cause: Task) -> list[int]:
        cuts = sorted({k for k in keys if k and key_in(k, region.start, region.end) and k != region.start})
        if not cuts:
            mid = middle_key(region.start, region.end)
            if mid is None:
                return []
            cuts = [mid]
        self._unindex(region)
        bounds = [region.start] + cuts + [region.end]
        parts = len(bounds) - 1
        share = 1.0 / parts
        region.version += 1  # one split command, one version bump (the driver budgets one per step)
        new_ids = []
        # TiKV's right-derive: the original region keeps the right-most range.
        for i in range(parts - 1):
            peers = tuple(Peer(self.new_id(), p.store_id, p.role) for p in region.peers)
            leader = next((q for q, p in zip(peers, region.peers) if p.id == region.leader_id), None)
            child = SimRegion(self.new_id(), bounds[i], bounds[i + 1], peers, leader.id if leader else None,
                              region.size * share, int(region.keys * share), region.conf_ver, region.version)
            child.pending = {q.id for q, p in zip(peers, region.peers) if p.id in region.pending}
            self._share_flows(region, child, share)
            self.regions[child.id] = child
            self._index(child)
            self.dirty.add(child.id)
            new_ids.append(child.id)
        region.start = bounds[-2]
        region.size *= share
        region.keys = int(region.keys * share)
        self._share_flows(region, region, share)
        self._index(region)
        self.dirty.add(region.id)
        self.splits += 1
        return new_ids

    @staticmethod
    def _share_flows(src: SimRegion, dst: SimRegion, share: float) -> None:
        for a in ("write_rate", "read_rate", "write_keys_rate", "read_keys_rate", "query_rate"):
            setattr(dst, a, getattr(src, a) * share)

    def merge_blocker(self, source: SimRegion, target: SimRegion) -> str:
        """Why ``source`` cannot merge into ``target`` now ("" when it can), as TiKV checks."""
        if not (source.end == target.start or target.end == source.start):
            return "not adjacent"
        if {p.store_id for p in source.peers} != {p.store_id for p in target.peers}:
            return "peers not on the same stores"
        for r in (source, target):
            if r.in_joint_state or r.pending or any(p.role != PeerRole.VOTER for p in r.peers):
                return f"region {r.id} is not a plain healthy voter set"
            if r.leader is None:
                return f"region {r.id} has no leader"
        return ""

    def merge_regions(self, source: SimRegion, target: SimRegion, cause: Task) -> None:
        self._unindex(source)
        self._unindex(target)
        if source.end == target.start:
            target.start = source.start
        else:
            target.end = source.end
        target.version = max(source.version, target.version) + 1
        target.size += source.size
        target.keys += source.keys
        for a in ("write_rate", "read_rate", "write_keys_rate", "read_keys_rate", "query_rate"):
            setattr(target, a, getattr(target, a) + getattr(source, a))
        del self.regions[source.id]
        self._leaderless.discard(source.id)
        for n in self.nodes.values():
            n.tasks.pop(source.id, None)
        self._index(target)
        self.dirty.add(target.id)
        self.dirty.discard(source.id)
        self.merges += 1

    def _record_move(self, region_id: int, frm: int, to: int, op_id: int | None, kind: str) -> None:
        mv = Move(self.now, region_id, frm, to, op_id, kind)
        self.moves.append(mv)
        seen = self._move_seen.setdefault((region_id, kind), {})
        back = seen.get((to, frm))
        if back is not None:
            self.reversed_moves.append((back, mv))
        seen[(frm, to)] = mv

    # ------------------------------------------------------------------ events
    def store_down(self, store_id: int) -> None:
        node = self.nodes[store_id]
        if not node.alive:
            return
        node.go_down(self.now)
        for r in self.regions.values():
            lead = r.leader
            if lead is not None and lead.store_id == store_id:
                r.leader_lost_at = self.now
                self._leaderless.add(r.id)

    def store_up(self, store_id: int) -> None:
        node = self.nodes[store_id]
        if node.alive or node.removed:
            return
        node.come_up(self.now)
        node.last_store_hb = self.now - self.config.store_hb_interval
        self._send_store_heartbeat(node)
        for r in self.regions.values():
            if r.peer_on(store_id) is not None:
                self.dirty.add(r.id)

    def set_slow(self, store_id: int, factor: float) -> None:
        self.nodes[store_id].slow = max(1.0, float(factor))

    def delete_store(self, store_id: int) -> None:
        """An admin removes a store: the driver drains it (offline), then it becomes a tombstone."""
        self.driver.set_store_state(store_id, StoreState.OFFLINE)

    def set_flow(self, region_ids, flow: Flow) -> None:
        for rid in region_ids:
            r = self.regions.get(rid)
            if r is None:
                continue
            r.write_rate, r.read_rate = flow.write_bytes, flow.read_bytes
            r.write_keys_rate, r.read_keys_rate, r.query_rate = flow.write_keys, flow.read_keys, flow.query

    def add_import(self, spot: ImportSpot) -> None:
        self.imports.append(spot)

    # ------------------------------------------------------------------ the tick
    def step(self) -> None:
        now = self.now
        cfg = self.config
        self._run_loads(now)
        for node in list(self.nodes.values()):
            if not node.alive or node.removed:
                continue
            for task in node.due_tasks(now):
                self._run_task(node, task)
        for node in list(self.nodes.values()):
            for job in node.progress_snapshots(self):
                self._finish_snapshot(job)
        self._elect(now)
        self._finish_removals()
        for node in self.nodes.values():
            if node.alive and not node.removed and (int(now) + node.id) % cfg.store_hb_interval == 0:
                self._send_store_heartbeat(node)
        self._deliver_replays(now)
        sent: set[int] = set()
        hb = [rid for rid in self.dirty]
        interval = max(1, cfg.region_hb_interval)
        t = int(now)
        for rid, r in self.regions.items():
            if (rid + t) % interval == 0:
                hb.append(rid)
        if cfg.push_operators:
            hb.extend(op.region_id for op in self.driver.controller.running())
        self.dirty = set()
        for rid in hb:
            if rid not in sent:
                sent.add(rid)
                self._send_region_heartbeat(rid)
        self.driver.tick(now)
        if cfg.push_operators:
            # the driver pushes the first step of an operator it just admitted
            for op in self.driver.controller.running():
                if op.region_id not in sent or op.status.value == "created":
                    sent.add(op.region_id)
                    self._send_region_heartbeat(op.region_id)
        if cfg.check_coverage:
            err = self.coverage_error()
            if err is not None:
                self.coverage_errors.append(f"tick {now:g}: {err}")
        self.now = now + 1.0

    def _run_loads(self, now: float) -> None:
        for rid in self._import_touched:
            r = self.regions.get(rid)
            if r is not None:
                r.import_rate = r.import_keys_rate = 0.0
        self._import_touched = set()
        for spot in self.imports:
            if now >= spot.until:
                continue
            r = self.region_at(spot.key)
            if r is None:
                continue
            self._unindex(r)
            r.size += spot.mib_per_tick
            r.keys += int(spot.mib_per_tick * spot.keys_per_mib)
            r.import_rate += spot.mib_per_tick * MIB
            r.import_keys_rate += spot.mib_per_tick * spot.keys_per_mib
            self._import_touched.add(r.id)
            self._index(r)
        self.imports = [s for s in self.imports if now < s.until]
        # traffic for the store heartbeats
        for r in self.regions.values():
            if r.write_rate or r.read_rate or r.query_rate or r.import_rate:
                lead = r.leader
                for p in r.peers:
                    n = self.nodes.get(p.store_id)
                    if n is not None and n.alive:
                        n.bytes_written += r.write_rate + r.import_rate
                        n.keys_written += r.write_keys_rate + r.import_keys_rate
                if lead is not None:
                    n = self.nodes.get(lead.store_id)
                    if n is not None and n.alive:
                        n.bytes_read += r.read_rate
                        n.keys_read += r.read_keys_rate
                        n.query_num += r.query_rate

    def _run_task(self, node: Node, task: Task) -> None:
        out = apply_step(self, node, task)
        name = type(task.step).__name__
        if out.applied:
            self.steps_applied[name] = self.steps_applied.get(name, 0) + 1
        else:
            self.steps_rejected[out.reason] = self.steps_rejected.get(out.reason, 0) + 1
        if out.applied and not task.duplicate and self.rng.random() < self.config.step_dup_prob:
            # the same command is applied again a little later (a retried proposal)
            region = self.regions.get(task.region_id)
            if region is not None and region.leader is not None and region.leader.store_id == node.id:
                dup = Task(task.region_id, task.step, task.operator_id, region.conf_ver, region.version,
                           self.now + 1 + self.rng.randrange(3), duplicate=True)
                node.tasks.setdefault(task.region_id, dup)

    def _finish_snapshot(self, job: SnapshotJob) -> None:
        r = self.regions.get(job.region_id)
        if r is None or job.peer_id not in r.pending:
            return
        r.pending.discard(job.peer_id)
        self.snapshot_mib += job.size
        self.snapshots_done += 1
        self.dirty.add(r.id)

    def _elect(self, now: float) -> None:
        if not self._leaderless:
            return
        for rid in list(self._leaderless):
            r = self.regions.get(rid)
            if r is None:
                self._leaderless.discard(rid)
                continue
            lead = r.leader
            if lead is not None and self.is_alive(lead.store_id):
                self._leaderless.discard(rid)  # the old leader came back in time
                r.leader_lost_at = None
                continue
            if r.leader_lost_at is None:
                r.leader_lost_at = now
            if now - r.leader_lost_at < self.config.election_ticks:
                continue
            if not quorum_ok(r.peers, self.is_alive):
                continue  # no quorum: the region is unavailable until a store comes back
            candidates = [p for p in r.peers if p.role == PeerRole.VOTER and p.id not in r.pending
                          and self.is_alive(p.store_id)]
            if not candidates:
                candidates = [p for p in r.peers if p.role == PeerRole.INCOMING_VOTER and p.id not in r.pending
                              and self.is_alive(p.store_id)]
            if not candidates:
                continue
            self.set_leader(r, self.rng.choice(candidates), cause=None)
            self.elections += 1

    def _finish_removals(self) -> None:
        """An offline store with no replica left becomes a tombstone (PD's checkStores)."""
        for sid, node in self.nodes.items():
            if node.removed:
                continue
            s = self.driver.cluster.get_store(sid)
            if s is None:
                continue
            if s.state == StoreState.TOMBSTONE or (s.state == StoreState.OFFLINE and self.peer_count(sid) == 0
                                                   and self.driver.cluster.region_count(sid) == 0):
                if s.state != StoreState.TOMBSTONE:
                    try:
                        self.driver.set_store_state(sid, StoreState.TOMBSTONE)
                    except ValueError:
                        continue
                node.removed = True
                node.alive = False
                node.tasks.clear()

    # ------------------------------------------------------------------ heartbeats
    def _send_store_heartbeat(self, node: Node, replay: StoreHeartbeat | None = None) -> None:
        hb = replay or StoreHeartbeat(node.store_heartbeat(self, self.now))
        if replay is None:
            if self.rng.random() < self.config.hb_drop_prob:
                return
            if self.rng.random() < self.config.hb_dup_prob:
                self._replays.append(_Replay(self.now + 1 + self.rng.randrange(3), "store", hb, node.id))
        try:
            self.driver.handle_store_heartbeat(hb)
        except HeartbeatError:
            self.heartbeats_refused += 1

    def region_view(self, r: SimRegion) -> Region:
        """What the leader reports about its region."""
        down_after = self.config.peer_down_after
        down, pending = [], []
        for p in r.peers:
            n = self.nodes.get(p.store_id)
            if n is None or n.removed or (not n.alive and n.down_since is not None
                                          and self.now - n.down_since >= down_after):
                down.append(p.id)  # silent too long
            if p.id in r.pending or n is None or not n.alive:
                pending.append(p.id)  # behind the leader's log (a silent peer lags too)
        interval = 1.0  # flows are reported per second (the hot-region scheduler's report_interval)
        return Region(
            id=r.id, start_key=r.start, end_key=r.end, epoch=RegionEpoch(r.conf_ver, r.version), peers=r.peers,
            leader=r.leader, approximate_size=max(1, int(round(r.size))), approximate_keys=int(r.keys),
            written_bytes=int((r.write_rate + r.import_rate) * interval), read_bytes=int(r.read_rate * interval),
            written_keys=int((r.write_keys_rate + r.import_keys_rate) * interval),
            read_keys=int(r.read_keys_rate * interval),
            query_num=int(r.query_rate * interval), down_peers=tuple(down), pending_peers=tuple(pending))

    def _send_region_heartbeat(self, rid: int) -> None:
        r = self.regions.get(rid)
        if r is None:
            return
        lead = r.leader
        if lead is None or not self.is_alive(lead.store_id):
            return
        hb = RegionHeartbeat(self.region_view(r))
        r.last_hb = self.now
        if self.rng.random() < self.config.hb_drop_prob:
            return
        if self.rng.random() < self.config.hb_dup_prob:
            self._replays.append(_Replay(self.now + 1 + self.rng.randrange(3), "region", hb, lead.store_id))
        self._deliver_region_heartbeat(hb, lead.store_id)

    def _deliver_region_heartbeat(self, hb: RegionHeartbeat, sender: int) -> None:
        self.heartbeats_sent += 1
        try:
            resp = self.driver.handle_region_heartbeat(hb)
        except HeartbeatError:
            self.heartbeats_refused += 1
            return
        if resp.step is None:
            return
        node = self.nodes.get(sender)
        r = self.regions.get(hb.region.id)
        if node is None or r is None or not node.alive:
            return
        self.steps_received += 1
        if self.rng.random() < self.config.step_drop_prob:
            self.steps_dropped += 1
            return
        # the task carries the epoch the driver saw (the heartbeat's), as PD's response does
        node.receive(r.id, resp.step, resp.operator_id, hb.region.epoch.conf_ver, hb.region.epoch.version,
                     self.now, self.config.fast_step_ticks, self.config.split_merge_ticks)

    def _deliver_replays(self, now: float) -> None:
        if not self._replays:
            return
        due = [x for x in self._replays if x.at <= now]
        self._replays = [x for x in self._replays if x.at > now]
        for x in due:
            if x.kind == "store":
                node = self.nodes.get(x.sender)
                if node is not None and node.alive and not node.removed:
                    self._send_store_heartbeat(node, replay=x.payload)
            else:
                if self.is_alive(x.sender):
                    self._deliver_region_heartbeat(x.payload, x.sender)

    # ------------------------------------------------------------------ checks
    def fit_violations(self, max_replicas: int | None = None, isolation_label: str = "",
                       extra: Callable[[SimRegion], str] | None = None, limit: int = 20) -> list[str]:
        """Regions that are not fully and cleanly replicated on up stores: the
        repair criterion. Each violation is one line naming the region."""
        cfg = self.driver.config
        want = max_replicas or cfg.max_replicas
        iso = isolation_label or cfg.isolation_level
        up = set(self.up_store_ids())
        out: list[str] = []
        for r in self.regions.values():
            why = ""
            voters = [p for p in r.peers if p.role == PeerRole.VOTER]
            if r.in_joint_state:
                why = "in joint state"
            elif r.leader is None or r.leader.store_id not in up:
                why = "no leader on an up store"
            elif r.pending:
                why = "pending peers"
            elif len(voters) != want or len(r.peers) != want:
                why = f"{len(voters)} voters / {len(r.peers)} peers, want {want}"
            elif any(p.store_id not in up for p in r.peers):
                why = "a peer on a store that is down or being removed"
            elif iso:
                vals = [self.nodes[p.store_id].labels.get(iso) for p in r.peers]
                if len(set(vals)) != len(vals):
                    why = f"two replicas share {iso} {vals}"
            if not why and extra is not None:
                why = extra(r)
            if why:
                out.append(f"region {r.id}: {why}")
                if len(out) >= limit:
                    break
        return out

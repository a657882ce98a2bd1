"""The cluster model: stores, regions and peers, as the heartbeats report them.

``Cluster`` keeps the indexes that schedulers need to be fast: regions by
store and role, and regions ordered by start key.
"""

from __future__ import annotations

import bisect
import random
import time
from dataclasses import dataclass, field, replace
from enum import Enum


class StoreState(str, Enum):
    """Administrative state; *down* is derived from the heartbeat age."""

    UP = "up"
    OFFLINE = "offline"  # being drained: its peers move away, then it becomes a tombstone
    TOMBSTONE = "tombstone"


class PeerRole(str, Enum):
    VOTER = "voter"
    LEARNER = "learner"
    INCOMING_VOTER = "incoming_voter"  # joint consensus: learner becoming voter
    DEMOTING_VOTER = "demoting_voter"  # joint consensus: voter becoming learner


@dataclass(frozen=True)
class Peer:
    id: int
    store_id: int
    role: PeerRole = PeerRole.VOTER

    @property
    def is_voter(self) -> bool:
        return self.role in (PeerRole.VOTER, PeerRole.INCOMING_VOTER, PeerRole.DEMOTING_VOTER)


@dataclass(frozen=True)
class RegionEpoch:
    conf_ver: int = 1  # bumped by membership changes
    version: int = 1  # bumped by splits and merges

    def is_stale_against(self, other: "RegionEpoch") -> bool:
        return self.conf_ver < other.conf_ver or self.version < other.version


@dataclass
class Store:
    id: int
    address: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    state: StoreState = StoreState.UP
    capacity: int = 0  # bytes (GPU memory given to data)
    available: int = 0
    used_size: int = 0
    region_count: int = 0  # as reported
    sending_snap_count: int = 0
    receiving_snap_count: int = 0
    is_busy: bool = False
    bytes_written: int = 0
    bytes_read: int = 0
    keys_written: int = 0
    keys_read: int = 0
    query_num: int = 0
    last_heartbeat: float = 0.0  # driver's clock when the last heartbeat arrived

    def is_down(self, now: float, max_down_time: float) -> bool:
        return self.state != StoreState.TOMBSTONE and now - self.last_heartbeat > max_down_time

    @property
    def used_ratio(self) -> float:
        return 1.0 - self.available / self.capacity if self.capacity else 0.0


@dataclass
class Region:
    id: int
    start_key: bytes = b""
    end_key: bytes = b""  # b"" = +infinity
    epoch: RegionEpoch = field(default_factory=RegionEpoch)
    peers: tuple[Peer, ...] = ()
    leader: Peer | None = None
    approximate_size: int = 1  # MiB
    approximate_keys: int = 0
    written_bytes: int = 0
    read_bytes: int = 0
    written_keys: int = 0
    read_keys: int = 0
    query_num: int = 0
    down_peers: tuple[int, ...] = ()  # peer ids
    pending_peers: tuple[int, ...] = ()  # peer ids

    def peer_on(self, store_id: int) -> Peer | None:
        for p in self.peers:
            if p.store_id == store_id:
                return p
        return None

    @property
    def store_ids(self) -> set[int]:
        return {p.store_id for p in self.peers}

    def voters(self) -> list[Peer]:
        return [p for p in self.peers if p.is_voter]

    def learners(self) -> list[Peer]:
        return [p for p in self.peers if p.role == PeerRole.LEARNER]

    def followers(self) -> list[Peer]:
        lid = self.leader.id if self.leader else None
        return [p for p in self.peers if p.is_voter and p.id != lid]

    @property
    def in_joint_state(self) -> bool:
        return any(p.role in (PeerRole.INCOMING_VOTER, PeerRole.DEMOTING_VOTER) for p in self.peers)

    def is_healthy(self) -> bool:
        return not self.down_peers and not self.pending_peers and not self.in_joint_state

    def contains(self, key: bytes) -> bool:
        return self.start_key <= key and (self.end_key == b"" or key < self.end_key)

    def clone(self, **changes) -> "Region":
        return replace(self, **changes)


class Cluster:
    """The driver's view: stores, regions, and indexes over them."""

    def __init__(self, max_store_down_time: float = 30.0, clock=time.monotonic):
        self.stores: dict[int, Store] = {}
        self.regions: dict[int, Region] = {}
        self.max_store_down_time = max_store_down_time
        self.clock = clock
        self._leaders: dict[int, set[int]] = {}  # store id -> region ids it leads
        self._followers: dict[int, set[int]] = {}
        self._learners: dict[int, set[int]] = {}
        self._region_size: dict[int, int] = {}  # store id -> sum of region sizes (MiB)
        self._leader_size: dict[int, int] = {}
        self._starts: list[bytes] = []  # sorted start keys
        self._start_to_id: dict[bytes, int] = {}
        self.total_flow_bytes = 0  # written + read bytes of every region's last heartbeat
        self.total_queries = 0

    # -- stores ----------------------------------------------------------
    def put_store(self, store: Store) -> None:
        self.stores[store.id] = store
        for index in (self._leaders, self._followers, self._learners):
            index.setdefault(store.id, set())
        self._region_size.setdefault(store.id, 0)
        self._leader_size.setdefault(store.id, 0)

    def get_store(self, store_id: int) -> Store | None:
        return self.stores.get(store_id)

    def forget_store(self, store_id: int) -> None:
        """Undo the registration of a store that holds no region (a registration
        the service could not persist)."""
        if self._region_size.get(store_id) or any(index.get(store_id) for index in
                                                   (self._leaders, self._followers, self._learners)):
            raise ValueError(f"store {store_id} holds regions; it cannot be forgotten")
        self.stores.pop(store_id, None)
        for index in (self._leaders, self._followers, self._learners, self._region_size, self._leader_size):
            index.pop(store_id, None)

    def up_stores(self) -> list[Store]:
        now = self.clock()
        return [s for s in self.stores.values()
                if s.state == StoreState.UP and not s.is_down(now, self.max_store_down_time)]

    def is_store_down(self, store_id: int) -> bool:
        s = self.stores.get(store_id)
        return s is None or s.is_down(self.clock(), self.max_store_down_time)

    # -- regions ---------------------------------------------------------
    def put_region(self, region: Region) -> None:
        old = self.regions.get(region.id)
        same_key = old is not None and old.start_key == region.start_key
        if same_key and old.peers == region.peers and old.leader == region.leader:
            # The common heartbeat: same members, new sizes and flows. Adjust the totals only.
            dsize = region.approximate_size - old.approximate_size
            if dsize:
                for p in region.peers:
                    self._region_size[p.store_id] += dsize
                if region.leader is not None:
                    self._leader_size[region.leader.store_id] += dsize
            self.total_flow_bytes += region.written_bytes + region.read_bytes - old.written_bytes - old.read_bytes
            self.total_queries += region.query_num - old.query_num
            self.regions[region.id] = region
            return
        if old is not None:
            self._unindex(old, keep_key=same_key)
        self.regions[region.id] = region
        self._index(region, keep_key=same_key)

    def remove_region(self, region_id: int) -> None:
        old = self.regions.pop(region_id, None)
        if old is not None:
            self._unindex(old)

    def _index(self, r: Region, keep_key: bool = False) -> None:
        lid = r.leader.id if r.leader else None
        for p in r.peers:
            self._ensure_store_index(p.store_id)
            if p.id == lid:
                self._leaders[p.store_id].add(r.id)
                self._leader_size[p.store_id] += r.approximate_size
            elif p.role == PeerRole.LEARNER:
                self._learners[p.store_id].add(r.id)
            else:
                self._followers[p.store_id].add(r.id)
            self._region_size[p.store_id] += r.approximate_size
        self.total_flow_bytes += r.written_bytes + r.read_bytes
        self.total_queries += r.query_num
        if keep_key:  # a heartbeat of a known region at the same start key: the key index stands
            return
        if r.start_key in self._start_to_id and self._start_to_id[r.start_key] != r.id:
            # Another region still starts here (a split or merge reported out of
            # order): the newer one, already checked by the driver, takes the key.
            self._drop_start(r.start_key)
        if r.start_key not in self._start_to_id:
            bisect.insort(self._starts, r.start_key)
        self._start_to_id[r.start_key] = r.id

    def _unindex(self, r: Region, keep_key: bool = False) -> None:
        lid = r.leader.id if r.leader else None
        for p in r.peers:
            if p.id == lid:
                self._leaders[p.store_id].discard(r.id)
                self._leader_size[p.store_id] -= r.approximate_size
            elif p.role == PeerRole.LEARNER:
                self._learners[p.store_id].discard(r.id)
            else:
                self._followers[p.store_id].discard(r.id)
            self._region_size[p.store_id] -= r.approximate_size
        self.total_flow_bytes -= r.written_bytes + r.read_bytes
        self.total_queries -= r.query_num
        if not keep_key and self._start_to_id.get(r.start_key) == r.id:
            self._drop_start(r.start_key)

    def _drop_start(self, key: bytes) -> None:
        i = bisect.bisect_left(self._starts, key)
        if i < len(self._starts) and self._starts[i] == key:
            self._starts.pop(i)
        self._start_to_id.pop(key, None)

    def _ensure_store_index(self, store_id: int) -> None:
        if store_id not in self._leaders:
            for index in (self._leaders, self._followers, self._learners):
                index.setdefault(store_id, set())
            self._region_size.setdefault(store_id, 0)
            self._leader_size.setdefault(store_id, 0)

    def region_for_key(self, key: bytes) -> Region | None:
        i = bisect.bisect_right(self._starts, key) - 1
        if i < 0:
            return None
        r = self.regions.get(self._start_to_id[self._starts[i]])
        return r if r is not None and r.contains(key) else None

    def overlapping(self, region: Region) -> list[Region]:
        """Known regions whose key range overlaps ``region``'s (other than itself)."""
        out = []
        i = max(bisect.bisect_right(self._starts, region.start_key) - 1, 0)
        while i < len(self._starts):
            start = self._starts[i]
            if region.end_key != b"" and start >= region.end_key:
                break
            r = self.regions[self._start_to_id[start]]
            if r.id != region.id and (r.end_key == b"" or r.end_key > region.start_key):
                out.append(r)
            i += 1
        return out

    def adjacent(self, region: Region) -> tuple[Region | None, Region | None]:
        """The regions just before and just after ``region`` in key order."""
        i = bisect.bisect_left(self._starts, region.start_key)
        prev = self.regions.get(self._start_to_id[self._starts[i - 1]]) if i > 0 else None
        nxt = None
        if region.end_key != b"":
            j = bisect.bisect_left(self._starts, region.end_key)
            if j < len(self._starts) and self._starts[j] == region.end_key:
                nxt = self.regions.get(self._start_to_id[region.end_key])
        return prev, nxt

    # -- per-store figures the schedulers read ---------------------------
    def leader_count(self, store_id: int) -> int:
        return len(self._leaders.get(store_id, ()))

    def region_count(self, store_id: int) -> int:
        return (len(self._leaders.get(store_id, ())) + len(self._followers.get(store_id, ()))
                + len(self._learners.get(store_id, ())))

    def region_size(self, store_id: int) -> int:
        return self._region_size.get(store_id, 0)

    def leader_size(self, store_id: int) -> int:
        return self._leader_size.get(store_id, 0)

    def leader_region_ids(self, store_id: int) -> set[int]:
        return self._leaders.get(store_id, set())

    def follower_region_ids(self, store_id: int) -> set[int]:
        return self._followers.get(store_id, set())

    def learner_region_ids(self, store_id: int) -> set[int]:
        return self._learners.get(store_id, set())

    def region_ids_on(self, store_id: int) -> set[int]:
        return self.leader_region_ids(store_id) | self.follower_region_ids(store_id) | self.learner_region_ids(store_id)

    def random_region_id(self, rng: random.Random) -> int | None:
        """A region id drawn uniformly from the whole cluster, in O(1)."""
        if not self._starts:
            return None
        return self._start_to_id[self._starts[rng.randrange(len(self._starts))]]

    def scan(self, start_key: bytes = b"", end_key: bytes = b""):
        """Regions overlapping ``[start_key, end_key)`` (b"" = to the end), in key order, lazily."""
        i = max(bisect.bisect_right(self._starts, start_key) - 1, 0)
        while i < len(self._starts):
            key = self._starts[i]
            i += 1
            if end_key != b"" and key >= end_key:
                return
            r = self.regions.get(self._start_to_id.get(key, -1))
            if r is None or (r.end_key != b"" and r.end_key <= start_key):
                continue
            yield r

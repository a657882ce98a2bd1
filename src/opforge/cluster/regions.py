"""Regions of distributed tables: key ranges the placement driver places, hash partitions of a table.

A table registered with ``partition_by=KEY`` is cut into ``count`` regions by a hash of the key
(``exchange.key_bits`` + ``opforge.distributed.hash_partition``, the hash the SQL shuffles use);
without a key, into ``count`` contiguous row ranges. Region ``i`` of table ``t`` covers the keys
``[key(t, i), key(t, i + 1))`` of the driver's key space (2 bytes of table id, 4 of region index),
so every table's regions are disjoint ranges and the driver's range checks hold.

A hot region is split (``split_half``): region ``i`` of a hash-partitioned table holds the rows
whose 31-bit key hash ``h`` has ``h % count == i``; its halves hold those whose next bit of
``h // count`` is 0 or 1. A region's ``sub`` is the string of those bits (``""`` unsplit, ``"01"``
after two splits), and its key range is ``key(t, i)`` followed by the bits as a binary fraction,
so the halves are the lower and upper half of the range and the split key is where the upper one
starts. A table without a partition key splits its rows in half by position.

A region's metadata (``RegionMeta``) is the coordinator's; workers keep a copy for the regions they
hold and report it in region heartbeats. Its data is an Arrow table; a copy between workers (a
learner being added) is the Arrow IPC stream of it (no pickle).
"""
from __future__ import annotations

import os
import struct
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

import pyarrow as pa
import torch

from opforge.distributed import hash_partition
from opforge.sql.column import Column


def region_key(table_id: int, index: int) -> bytes:
    return struct.pack(">HI", table_id, index)


@dataclass
class RegionMeta:
    id: int
    table: str
    index: int
    start_key: str  # hex, as heartbeats carry keys
    end_key: str
    peers: list[dict] = field(default_factory=list)  # {"id", "store_id", "role"}
    leader_peer_id: int = 0
    conf_ver: int = 1
    version: int = 1
    rows: int = 0
    bytes: int = 0
    table_id: int = 0
    sub: str = ""  # the hash bits that split this region off bucket ``index`` (see the module docstring)

    def to_json(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_json(d: dict) -> "RegionMeta":
        return RegionMeta(**d)

    def peer_on(self, store_id: int) -> dict | None:
        return next((p for p in self.peers if p["store_id"] == store_id), None)

    @property
    def leader_store(self) -> int | None:
        p = next((p for p in self.peers if p["id"] == self.leader_peer_id), None)
        return None if p is None else p["store_id"]

    def heartbeat(self, down_stores=(), flow: dict | None = None) -> dict:
        """The region heartbeat its leader sends (``placement/heartbeat.py``'s wire form); ``flow``:
        read_bytes / read_keys / query_num per second since the last one."""
        return {**(flow or {}), "region_id": self.id, "start_key": self.start_key, "end_key": self.end_key,
                "epoch": {"conf_ver": self.conf_ver, "version": self.version},
                "peers": [dict(p) for p in self.peers], "leader_peer_id": self.leader_peer_id,
                "approximate_size": max(1, self.bytes >> 20), "approximate_keys": self.rows,
                "down_peers": [p["id"] for p in self.peers if p["store_id"] in down_stores]}


MAX_SPLIT_BITS = 24  # a region is split at most this many times (hash bits below the bucket)


def sub_range(table_id: int, index: int, sub: str) -> tuple[bytes, bytes]:
    """(start, end) key of the region of bucket ``index`` and split bits ``sub``."""
    def at(bits: str) -> bytes:
        if not bits:
            return region_key(table_id, index)
        padded = bits + "0" * (-len(bits) % 8)
        raw = int(padded, 2).to_bytes(len(padded) // 8, "big").rstrip(b"\0")
        return region_key(table_id, index) + raw
    if not sub or "0" not in sub:
        end = region_key(table_id, index + 1)
    else:  # the next fraction of the same length: the last 0 becomes 1, the 1s after it 0s
        cut = sub.rindex("0")
        end = at(sub[:cut] + "1")
    return at(sub), end


def split_half(table: pa.Table, partition_by: str | None, buckets: int, sub: str) -> tuple[pa.Table, pa.Table]:
    """The lower and upper half of a region's rows (``sub``: its split bits so far). Every replica
    holds the same rows in the same order, so every replica cuts them alike."""
    if partition_by is None:
        n = table.num_rows
        return table.slice(0, n // 2), table.slice(n // 2)
    from opforge.cluster.exchange import key_bits

    key = Column.from_arrow(table.column(partition_by), "cpu", partition_by)
    h = hash_partition(key_bits(key), 1 << 31) if table.num_rows else torch.zeros(0, dtype=torch.int64)
    upper = ((h // buckets) >> len(sub)) & 1 == 1
    idx = torch.arange(table.num_rows)
    return table.take(pa.array(idx[~upper].numpy())), table.take(pa.array(idx[upper].numpy()))


def split(table: pa.Table, count: int, partition_by: str | None) -> list[pa.Table]:
    """``table`` cut into ``count`` regions: by a hash of ``partition_by``, else by row ranges."""
    if partition_by is None:
        n = table.num_rows
        return [table.slice(n * i // count, n * (i + 1) // count - n * i // count) for i in range(count)]
    from opforge.cluster.exchange import key_bits  # the hash the SQL shuffles use

    key = Column.from_arrow(table.column(partition_by), "cpu", partition_by)
    dest = hash_partition(key_bits(key), count)
    order = pa.array(torch.sort(dest, stable=True).indices.numpy())
    counts = torch.bincount(dest, minlength=count).tolist()
    # one gather per column on every core (Arrow's take runs on the calling thread, without the GIL)
    with ThreadPoolExecutor(max(1, min(table.num_columns, os.cpu_count() or 1))) as pool:
        ordered = pa.Table.from_arrays(list(pool.map(lambda c: c.take(order), table.columns)), schema=table.schema)
    out, start = [], 0
    for c in counts:
        out.append(ordered.slice(start, c))
        start += c
    return out


def table_bytes(t: pa.Table) -> int:
    return int(t.nbytes)


def to_ipc(t: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, t.schema) as w:
        w.write_table(t)
    return sink.getvalue().to_pybytes()


def from_ipc(data: bytes) -> pa.Table:
    return pa.ipc.open_stream(pa.py_buffer(data)).read_all()

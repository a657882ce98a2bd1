"""Where spilled partitions wait: pinned host memory first, files on disk once the host limit is
used up (numpy .npz files, read back with pickle off), read back to the device one partition at a time.

A ``SpillStore`` belongs to one operator run: ``put(key, batch)`` files a piece of partition
``key`` (a batch's columns leave the device), ``take(key)`` gives the pieces back on the device
and forgets them (files deleted). ``stats`` counts the bytes that went to each tier, for EXPLAIN
ANALYZE. String dictionaries are host data already and travel with the pieces untouched."""
from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from dataclasses import dataclass

import numpy as np
import torch

from opforge.sql.column import Column
from opforge.sql.expr import Batch
from opforge.sql.profile import batch_bytes


@dataclass
class SpillStats:
    host_bytes: int = 0
    disk_bytes: int = 0
    pieces: int = 0


# every store's spills in this process, for benchmarks that time plain runs (no EXPLAIN ANALYZE)
TOTALS = SpillStats()


@dataclass
class _Piece:
    n: int
    device: torch.device
    meta: dict  # cid -> (type, dictionary, has_valid)
    tensors: dict | None  # on the host tier: name -> host tensor
    path: str | None  # on the disk tier
    nbytes: int


class SpillStore:
    def __init__(self, host_limit: int, spill_dir: str | None = None):
        self.host_limit = host_limit
        self.host_used = 0
        self.stats = SpillStats()
        self._parent_dir = spill_dir
        self._dir: str | None = None
        self._pieces: dict = {}
        self._ids = itertools.count()

    def put(self, key, batch: Batch) -> None:
        if batch.n == 0:
            return
        nbytes = batch_bytes(batch)
        tensors, meta = {}, {}
        for cid, c in batch.cols.items():
            tensors[f"{cid}.v"] = c.values
            if c.valid is not None:
                tensors[f"{cid}.m"] = c.valid
            meta[cid] = (c.type, c.dictionary, c.valid is not None)
        self.stats.pieces += 1
        TOTALS.pieces += 1
        if self.host_used + nbytes <= self.host_limit:
            self.host_used += nbytes
            self.stats.host_bytes += nbytes
            TOTALS.host_bytes += nbytes
            piece = _Piece(batch.n, batch.device, meta, {k: _to_host(t) for k, t in tensors.items()}, None, nbytes)
        else:
            path = os.path.join(self._directory(), f"{next(self._ids)}.npz")
            np.savez(path, **{k: t.cpu().numpy() for k, t in tensors.items()})
            self.stats.disk_bytes += nbytes
            TOTALS.disk_bytes += nbytes
            piece = _Piece(batch.n, batch.device, meta, None, path, nbytes)
        self._pieces.setdefault(key, []).append(piece)

    def rows(self, key) -> int:
        return sum(p.n for p in self._pieces.get(key, ()))

    def nbytes(self, key) -> int:
        return sum(p.nbytes for p in self._pieces.get(key, ()))

    def take(self, key):
        """The pieces of partition ``key`` back on the device one at a time, in the order they were
        put (each leaves the store as it is read)."""
        for p in self._pieces.pop(key, []):
            if p.tensors is not None:
                tensors = p.tensors
                self.host_used -= p.nbytes
            else:
                with np.load(p.path, allow_pickle=False) as f:
                    tensors = {k: torch.from_numpy(f[k]) for k in f.files}
                os.remove(p.path)
            dev = p.device
            cols = {cid: Column(tensors[f"{cid}.v"].to(dev, non_blocking=True),
                                tensors[f"{cid}.m"].to(dev, non_blocking=True) if has_valid else None, typ, words)
                    for cid, (typ, words, has_valid) in p.meta.items()}
            yield Batch(cols, p.n, dev)

    def drop(self, key) -> None:
        for p in self._pieces.pop(key, []):
            if p.tensors is not None:
                self.host_used -= p.nbytes
            else:
                os.remove(p.path)

    def close(self) -> None:
        self._pieces.clear()
        self.host_used = 0
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def _directory(self) -> str:
        if self._dir is None:
            if self._parent_dir is not None:
                os.makedirs(self._parent_dir, exist_ok=True)
            self._dir = tempfile.mkdtemp(prefix="opforge-spill-", dir=self._parent_dir)
        return self._dir


def _to_host(t: torch.Tensor) -> torch.Tensor:
    """A host copy: pinned when the tensor is on a GPU (the copy back is then asynchronous)."""
    if t.device.type == "cuda":
        host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        host.copy_(t, non_blocking=True)
        return host
    return t  # the CPU is the host: the piece (a fresh gather) is kept as it is

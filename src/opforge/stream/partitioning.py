"""How records move from the subtasks of one operator to the next, and what
each way costs (Flink's partitioners).

* ``forward``: subtask i feeds subtask i; no copy, no exchange; needs equal
  parallelism (the default between equal parallelisms: operators chain).
* ``rebalance``: round-robin over all downstream subtasks; evens out skew at
  the price of an all-to-all exchange (every record crosses a channel; on
  many GPUs, a network or NVLink copy).
* ``rescale``: round-robin within a local group (upstream i feeds a
  contiguous slice of the downstream subtasks): fewer channels than
  rebalance, local copies only.
* ``shuffle``: uniformly random target; all-to-all like rebalance, without
  its perfect balance.
* ``broadcast``: every record to every subtask: ``parallelism`` copies.
* ``partition_custom(fn, key)``: the user's ``fn(key, num_partitions)``.
* key hashing (``key_by``): key id -> hash -> one of ``MAX_PARALLELISM`` key
  groups -> subtask ``group * p // MAX_PARALLELISM`` (Flink's key groups, so
  state can later be rescaled by moving whole key groups); all-to-all, and
  skewed keys make skewed subtasks.

Each partitioner returns, for a batch, the target subtask of every row (one
vectorized pass) or a list of targets for broadcast.
"""

from __future__ import annotations

import torch

MAX_PARALLELISM = 128


def hash_keys(keys: torch.Tensor) -> torch.Tensor:
    """A 31-bit mix of int64 key ids (same on every device; no overflow)."""
    h = (keys ^ (keys >> 32)) & 0xFFFFFFFF
    h = ((h ^ (h >> 16)) * 0x45D9F3B) & 0xFFFFFFFF
    h = ((h ^ (h >> 16)) * 0x45D9F3B) & 0xFFFFFFFF
    return (h ^ (h >> 16)) & 0x7FFFFFFF


def key_group_targets(keys: torch.Tensor, parallelism: int) -> torch.Tensor:
    groups = hash_keys(keys) % MAX_PARALLELISM
    return groups * parallelism // MAX_PARALLELISM


class Partitioner:
    name = "partitioner"
    needs_keys = False

    def fresh(self) -> "Partitioner":
        """A copy with no running state, for one job run."""
        return self

    def connected(self, upstream: int, up_parallelism: int, down_parallelism: int) -> list[int]:
        """Downstream subtasks an upstream subtask can send to."""
        return list(range(down_parallelism))

    def targets(self, batch, upstream: int, down_parallelism: int) -> torch.Tensor:
        raise NotImplementedError


class ForwardPartitioner(Partitioner):
    name = "forward"

    def connected(self, upstream, up_parallelism, down_parallelism):
        return [upstream]

    def targets(self, batch, upstream, down_parallelism):
        return torch.full((len(batch),), upstream, dtype=torch.int64, device=batch.device)


class RebalancePartitioner(Partitioner):
    name = "rebalance"

    def __init__(self):
        self.next: dict[int, int] = {}

    def fresh(self):
        return type(self)()

    def targets(self, batch, upstream, down_parallelism):
        start = self.next.get(upstream, upstream % down_parallelism)
        n = len(batch)
        self.next[upstream] = (start + n) % down_parallelism
        return (torch.arange(n, device=batch.device) + start) % down_parallelism


class RescalePartitioner(Partitioner):
    name = "rescale"

    def __init__(self):
        self.next: dict[int, int] = {}

    def fresh(self):
        return type(self)()

    def connected(self, upstream, up_parallelism, down_parallelism):
        if down_parallelism >= up_parallelism:
            lo = upstream * down_parallelism // up_parallelism
            hi = (upstream + 1) * down_parallelism // up_parallelism
            return list(range(lo, max(hi, lo + 1)))
        return [upstream * down_parallelism // up_parallelism]

    def targets(self, batch, upstream, down_parallelism):
        group = self.connected(upstream, batch.meta["up_parallelism"], down_parallelism)
        start = self.next.get(upstream, 0)
        n = len(batch)
        self.next[upstream] = (start + n) % len(group)
        local = (torch.arange(n, device=batch.device) + start) % len(group)
        return local + group[0]


class ShufflePartitioner(Partitioner):
    name = "shuffle"

    def __init__(self, seed: int = 0):
        self.seed = seed
        self.gen = torch.Generator().manual_seed(seed)

    def fresh(self):
        return ShufflePartitioner(self.seed)

    def targets(self, batch, upstream, down_parallelism):
        return torch.randint(0, down_parallelism, (len(batch),), generator=self.gen).to(batch.device)


class BroadcastPartitioner(Partitioner):
    name = "broadcast"


class KeyGroupPartitioner(Partitioner):
    name = "hash"
    needs_keys = True

    def targets(self, batch, upstream, down_parallelism):
        return key_group_targets(batch.keys, down_parallelism)


class CustomPartitioner(Partitioner):
    """``fn(key, num_partitions) -> int`` per record (a Python call per record),
    or a ``@vectorized`` fn taking the key tensor."""

    name = "custom"

    def __init__(self, fn, key_selector):
        self.fn = fn
        self.key_selector = key_selector

    def targets(self, batch, upstream, down_parallelism):
        from opforge.stream.functions import is_vectorized

        keys = self.key_selector.python_or_tensor(batch)
        if is_vectorized(self.fn):
            out = torch.as_tensor(self.fn(keys, down_parallelism), dtype=torch.int64).to(batch.device)
        else:
            vals = keys.tolist() if isinstance(keys, torch.Tensor) else keys
            out = torch.tensor([self.fn(k, down_parallelism) for k in vals], dtype=torch.int64,
                               device=batch.device)
        if out.numel() and (int(out.min()) < 0 or int(out.max()) >= down_parallelism):
            raise ValueError(f"partition_custom: the partitioner returned a partition outside "
                             f"[0, {down_parallelism})")
        return out

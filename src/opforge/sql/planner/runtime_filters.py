"""Runtime filters: what a join's build side tells its probe side before the probe is read.

Once the build side's keys are known, three filters of increasing cost and precision are made
from them (all torch ops on the keys' device, no per-row Python):
* min / max of the keys: a probe row outside [min, max] cannot match; a partition (file, row
  group) whose own [min, max] misses it is not read at all (dynamic partition pruning);
* an IN-list: the sorted distinct keys, when there are at most ``IN_LIST_MAX`` of them (exact
  membership by ``searchsorted``; partitions whose range holds none of them are pruned too);
* a Bloom filter otherwise: ``BLOOM_BITS_PER_KEY`` bits per key, ``BLOOM_HASHES`` hash functions
  by double hashing of one 64-bit mix; false-positive rate ~(1 - e^(-k n / m))^k (1.7 % at 10
  bits and 3 hashes). ``BloomFilter`` stores bits one per byte (a bool tensor): setting them is
  one ``index_fill_`` with no atomics, testing them one gather per hash. The runtime filter uses
  the GPU-friendly *blocked* variant, ``BlockedBloomFilter`` (Putze et al.): one hash picks a
  256-bit block (four int64 words: one 32-byte DRAM sector), the key's k bits all lie in it, so a
  probe touches one sector instead of k random ones; built with torch ops (the distinct
  (word, bit) pairs of all keys, summed per word: a sum of distinct powers of two is their OR).
  Its bit positions are ``opforge.ops.bloom.block_positions``, the reference of the op that tests
  it: ``opforge.blocked_bloom_probe`` (one Triton pass on a GPU: key, range, NULL and bits).

``RuntimeFilter.mask`` with a blocked Bloom filter is that one op call (the range [min, max], the
probe side's NULL mask and the bits); with an IN-list, a range test and a ``searchsorted`` in the
probe keys' own dtype (an int32 column is not widened to int64: bounds are clamped to its range
and the list cut to it).

Each filter passes every probe row that can match (no false negatives): applying it before the
join never changes the join's answer, only the rows the join reads.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from opforge.ops.bloom import BLOCK_WORDS, MAX_HASHES, blocked_bloom_probe, bloom_contains, build_words
from opforge.sql.planner.statistics import as_int64, mix64

IN_LIST_MAX = 1024
BLOOM_BITS_PER_KEY = 10
BLOOM_HASHES = 3


@dataclass
class BloomFilter:
    bits: torch.Tensor  # bool, a power-of-two length
    hashes: int

    @staticmethod
    def build(keys: torch.Tensor, bits_per_key: int = BLOOM_BITS_PER_KEY, hashes: int = BLOOM_HASHES) -> "BloomFilter":
        if bits_per_key < 1 or hashes < 1:
            raise ValueError(f"BloomFilter.build: bits_per_key and hashes must be >= 1, got {bits_per_key}, {hashes}")
        m = 1 << max(6, (max(1, keys.numel()) * bits_per_key - 1).bit_length())
        bits = torch.zeros(m, dtype=torch.bool, device=keys.device)
        for pos in _positions(keys, m, hashes):
            bits.index_fill_(0, pos, True)
        return BloomFilter(bits, hashes)

    def might_contain(self, keys: torch.Tensor) -> torch.Tensor:
        m = self.bits.numel()
        out = torch.ones(keys.shape, dtype=torch.bool, device=keys.device)
        for pos in _positions(keys, m, self.hashes):
            out &= self.bits[pos]
        return out


@dataclass
class BlockedBloomFilter:
    words: torch.Tensor  # int64, BLOCK_WORDS per block, a power-of-two number of blocks
    hashes: int

    @staticmethod
    def build(keys: torch.Tensor, bits_per_key: int = BLOOM_BITS_PER_KEY,
              hashes: int = BLOOM_HASHES) -> "BlockedBloomFilter":
        if bits_per_key < 1 or not 1 <= hashes <= MAX_HASHES:
            raise ValueError(f"BlockedBloomFilter.build: bits_per_key must be >= 1 and hashes in 1..{MAX_HASHES}, "
                             f"got {bits_per_key}, {hashes}")
        bits = max(1, keys.numel()) * bits_per_key
        blocks = 1 << max(0, (-(-bits // (64 * BLOCK_WORDS)) - 1).bit_length())
        return BlockedBloomFilter(build_words(as_int64(keys).reshape(-1), blocks, hashes), hashes)

    def might_contain(self, keys: torch.Tensor) -> torch.Tensor:
        if keys.dtype in (torch.int32, torch.int64) and keys.dim() == 1:
            return blocked_bloom_probe(self.words, keys, self.hashes)
        return bloom_contains(self.words, as_int64(keys).reshape(-1), self.hashes).reshape(keys.shape)

    @property
    def size_bits(self) -> int:
        return self.words.numel() * 64


def _positions(keys: torch.Tensor, m: int, hashes: int):
    """Bit positions h1 + i * h2 (mod m) of each key for i < hashes (Kirsch & Mitzenmacher)."""
    h = mix64(as_int64(keys))
    h1 = h & (m - 1)
    h2 = ((h >> 32) & 0xFFFFFFFF) | 1  # odd: the probes walk all of a power-of-two table
    for i in range(hashes):
        yield (h1 + i * h2) & (m - 1)


@dataclass
class RuntimeFilter:
    """The filters made from one build side's keys (None when the build side is empty)."""

    min: int | None
    max: int | None
    in_list: torch.Tensor | None  # sorted distinct keys, when few
    bloom: BlockedBloomFilter | BloomFilter | None  # when the keys are many

    @staticmethod
    def build(keys: torch.Tensor, valid: torch.Tensor | None = None, in_list_max: int = IN_LIST_MAX) -> "RuntimeFilter":
        """From the build side's int keys (``valid``: False where the key is NULL: never matches)."""
        if keys.dtype.is_floating_point:
            raise TypeError("RuntimeFilter.build: expected integer join keys (as join_keys packs them), "
                            f"got {keys.dtype}")
        k = keys.long() if valid is None else keys.long()[valid]
        if k.numel() == 0:
            return RuntimeFilter(None, None, k, None)
        lo, hi = torch.stack(torch.aminmax(k)).tolist()  # one read-back for both bounds
        distinct = torch.unique(k)
        if distinct.numel() <= in_list_max:
            return RuntimeFilter(lo, hi, distinct, None)
        return RuntimeFilter(lo, hi, None, BlockedBloomFilter.build(distinct))

    def mask(self, keys: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        """True for each probe row that may find a match."""
        if self.min is None:
            return torch.zeros(keys.shape, dtype=torch.bool, device=keys.device)
        if valid is not None and valid.dtype != torch.bool:
            valid = valid.bool()
        k = keys if keys.dtype in (torch.int32, torch.int64) else keys.long()
        if isinstance(self.bloom, BlockedBloomFilter) and k.dim() == 1:  # range, NULLs and bits: one pass
            return blocked_bloom_probe(self.bloom.words, k, self.bloom.hashes, self.min, self.max, valid)
        info = torch.iinfo(k.dtype)
        if self.min > info.max or self.max < info.min:  # no key of this dtype is in range
            return torch.zeros(k.shape, dtype=torch.bool, device=k.device)
        # bounds clamped to the keys' dtype: an int32 tensor compared with a Python int past its range wraps
        keep = (k >= max(self.min, info.min)) & (k <= min(self.max, info.max))
        if valid is not None:
            keep &= valid
        if self.in_list is not None:
            listed = self.in_list
            if listed.dtype != k.dtype:  # the listed keys an int32 column can hold, as int32 (still sorted)
                listed = listed[(listed >= info.min) & (listed <= info.max)].to(k.dtype)
            if listed.numel() == 0:
                return torch.zeros(k.shape, dtype=torch.bool, device=k.device)
            pos = torch.searchsorted(listed, k).clamp(max=listed.numel() - 1)
            keep &= listed[pos] == k
        elif self.bloom is not None:
            keep &= self.bloom.might_contain(k)
        return keep

    def keep_partitions(self, part_min: torch.Tensor, part_max: torch.Tensor) -> torch.Tensor:
        """Partition pruning: True for each partition (its keys in [part_min, part_max]) that may
        hold a matching row: its range meets [min, max] and, with an IN-list, holds one of them."""
        lo, hi = part_min.long(), part_max.long()
        if self.min is None:
            return torch.zeros(lo.shape, dtype=torch.bool, device=lo.device)
        keep = (hi >= self.min) & (lo <= self.max)
        if self.in_list is not None:
            first = torch.searchsorted(self.in_list, lo)  # the first listed key >= the partition's min
            has = first < self.in_list.numel()
            keep &= has & (self.in_list[first.clamp(max=self.in_list.numel() - 1)] <= hi)
        return keep

    def describe(self) -> str:
        if self.min is None:
            return "runtime filter: empty build side"
        if self.in_list is not None:
            kind = f"IN-list of {self.in_list.numel()}"
        elif isinstance(self.bloom, BlockedBloomFilter):
            kind = f"blocked Bloom {self.bloom.size_bits} bits x {self.bloom.hashes} hashes"
        else:
            kind = f"Bloom {self.bloom.bits.numel()} bits x {self.bloom.hashes} hashes"
        return f"runtime filter: [{self.min}, {self.max}] + {kind}"

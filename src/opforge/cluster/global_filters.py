"""Runtime filters across workers: one filter from the whole build side, whichever worker holds it.

A filter built from one worker's share of the build side would drop probe rows that match build
rows on other workers, so each worker builds its part and the parts are merged over the group
before any probe row moves: the bounds are the min / max of every worker's bounds; when all the
workers' distinct keys together are few (``IN_LIST_MAX``) they are gathered into one IN-list,
else every worker sets the bits of its keys in a blocked Bloom filter of one size (from the total
key count) and the filters are OR-ed (a Bloom filter of a union is the OR of theirs). The merged
filter passes every probe row that can match anywhere, so it is pushed into the probe side's scans
(``physical/runtime_filter.route``) like the single-process one, and cuts what they shuffle.
"""
from __future__ import annotations

import torch

import opforge.distributed as D
from opforge.distributed.collectives import exchange
from opforge.ops.bloom import BLOCK_WORDS, build_words
from opforge.sql.planner.runtime_filters import BLOOM_BITS_PER_KEY, BLOOM_HASHES, IN_LIST_MAX, BlockedBloomFilter, \
    RuntimeFilter
from opforge.sql.planner.statistics import as_int64

_HI, _LO = torch.iinfo(torch.int64).max, torch.iinfo(torch.int64).min


def _blocks(keys: int) -> int:
    """BlockedBloomFilter.build's block count for ``keys`` keys (one size on every worker)."""
    bits = max(1, keys) * BLOOM_BITS_PER_KEY
    return 1 << max(0, (-(-bits // (64 * BLOCK_WORDS)) - 1).bit_length())


def build(keys: torch.Tensor, valid: torch.Tensor | None, group=None) -> tuple[RuntimeFilter, int]:
    """The filter of every worker's build keys (int keys; ``valid`` False where NULL), and the
    bytes this worker sent to make it. Collective: every worker calls it for the same join; two
    collectives (the counts and bounds, then the keys or the Bloom words), one when no key."""
    k = keys.long() if valid is None else keys.long()[valid]
    distinct = torch.unique(k)
    lo, hi = (int(distinct[0]), int(distinct[-1])) if distinct.numel() else (_HI, _LO)
    dev = D.device(group)
    table = exchange("opforge.cluster.global_filters", "build keys' counts and bounds", [distinct.numel(), lo, hi],
                     "", group)
    total = int(table[:, 0].sum())
    sent = 24
    if total == 0:
        return RuntimeFilter(None, None, k[:0], None), sent
    lo, hi = int(table[:, 1].min()), int(table[:, 2].max())
    if total <= IN_LIST_MAX:
        every = D.all_gather(distinct.to(dev), group=group, sizes=table[:, 0].tolist())
        return RuntimeFilter(lo, hi, torch.unique(every).to(keys.device), None), sent + 8 * distinct.numel()
    words = build_words(as_int64(distinct), _blocks(total), BLOOM_HASHES)
    every = D.all_gather(words.reshape(1, -1).to(dev), group=group, sizes=[1] * len(table)).to(keys.device)
    merged = every[0].clone()
    for row in every[1:]:
        merged |= row
    return RuntimeFilter(lo, hi, None, BlockedBloomFilter(merged, BLOOM_HASHES)), sent + 8 * words.numel()

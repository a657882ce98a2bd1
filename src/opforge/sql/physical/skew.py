"""Partitioned equi-joins and their skew handling.

A partitioned join sends each row to the partition of its key (``dest``: radix bits of a hash on
one device, a worker in the distributed mode) and joins every partition on its own. A key that
holds a large share of the probe rows (a heavy hitter) would put all of them in one partition, which
then dominates the run time (and, on a worker, its memory). Skew handling splits those keys off:

* heavy keys come from the statistics' most-common values of the probe key (the planner passes
  them, ``Join.heavy_keys``) and from a strided sample of the probe keys at run time (values above
  ``skew_threshold`` of the sample);
* probe rows with a heavy key are dealt round-robin over the partitions (no partition gets more
  than its share of them);
* build rows with a heavy key are replicated to every partition (a broadcast sub-join: they are
  few, since a heavy *probe* key has few build rows in a key-foreign-key join).

Each heavy probe row lands in exactly one partition and meets there every build row of its key,
so the pairs are those of the plain join; the pairs are put back in the unpartitioned order (by
probe row, then build row), so the answer does not depend on the partitioning or on the skew
handling. Only the probe side may be an outer join's preserved side (``how`` "left" / "semi" /
"anti" keep it whole): replicated build rows never produce unmatched rows twice.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from opforge.ops import hashing

SKEW_SAMPLE_ROWS = 1 << 16
_DEST_MUL = 0xC2B2AE3D27D4EB4F - (1 << 64)  # the radix partitioner's multiplier (keys.partition_of)


def hash_dest(keys: torch.Tensor, n: int) -> torch.Tensor:
    """Destination 0..n-1 of each int key (n need not be a power of two): a multiplicative hash's
    high bits modulo n. Equal keys go to one destination on every side of a join."""
    h = keys.long() * _DEST_MUL
    return ((h >> 33) & 0x3FFFFFFF) % n


def heavy_keys(pkey: torch.Tensor, pvalid: torch.Tensor | None, threshold: float | None,
               planned=()) -> torch.Tensor | None:
    """The probe key values above ``threshold`` of the probe rows: those sampled at run time plus
    ``planned`` (the statistics' heavy hitters) that occur in the sample at all. None: no skew."""
    if threshold is None or pkey.numel() == 0:
        return None
    k = pkey.long() if pvalid is None else pkey.long()[pvalid]
    if k.numel() == 0:
        return None
    step = max(1, k.numel() // SKEW_SAMPLE_ROWS)
    sample = k[::step]
    uniq, counts = torch.unique(sample, return_counts=True)
    heavy = uniq[counts > threshold * sample.numel()]
    if planned:
        hint = torch.tensor([int(v) for v in planned], dtype=torch.long, device=k.device)
        hint = hint[torch.isin(hint, uniq)]
        heavy = torch.unique(torch.cat([heavy, hint]))
    return heavy if heavy.numel() else None


def split(dest: torch.Tensor, n: int) -> list[torch.Tensor]:
    """Row indices of each destination 0..n-1, in row order (one stable sort, one host sync)."""
    order = torch.sort(dest, stable=True).indices
    sizes = torch.bincount(dest, minlength=n).tolist()
    return list(torch.split(order, sizes))


@dataclass
class PartitionReport:
    """What one partitioned join did (EXPLAIN ANALYZE's notes, tests)."""

    parts: int
    loads: list[int]  # build + probe rows per partition, after skew handling
    plain_loads: list[int]  # the same without skew handling
    heavy: list[int] = field(default_factory=list)  # heavy key values handled apart
    heavy_probe_rows: int = 0
    replicated_build_rows: int = 0

    def describe(self) -> str:
        text = f"{self.parts} partitions, largest {max(self.loads, default=0)} rows"
        if self.heavy:
            shown = ", ".join(str(v) for v in self.heavy[:5]) + (" ..." if len(self.heavy) > 5 else "")
            text += (f"; skew: heavy keys [{shown}] ({self.heavy_probe_rows} probe rows dealt round-robin, "
                     f"{self.replicated_build_rows} build rows replicated to every partition); largest "
                     f"partition without skew handling {max(self.plain_loads, default=0)} rows")
        return text


def partitioned_pairs(bkey, pkey, bvalid, pvalid, bdest, pdest, n: int, how: str = "inner",
                      heavy: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, PartitionReport]:
    """``opforge.hash_join`` per partition -> (build_index, probe_index, report), as the
    unpartitioned call orders them (by probe row, then build row)."""
    dev = bkey.device
    plain = (torch.bincount(bdest, minlength=n) + torch.bincount(pdest, minlength=n)).tolist()
    report = PartitionReport(n, plain, plain)
    hb = None
    if heavy is not None and heavy.numel():
        hp = torch.isin(pkey.long(), heavy)
        if pvalid is not None:
            hp &= pvalid
        hb = torch.isin(bkey.long(), heavy)
        if bvalid is not None:
            hb &= bvalid
        rank = torch.cumsum(hp.long(), 0) - 1
        pdest = torch.where(hp, rank % n, pdest)
        bdest = torch.where(hb, torch.full_like(bdest, n), bdest)  # bucket n: replicated
        report.heavy = heavy.tolist()
        report.heavy_probe_rows = int(hp.sum())
        report.replicated_build_rows = int(hb.sum())
    bparts = split(bdest, n + 1)
    pparts = split(pdest, n)
    shared = bparts[n]
    out_b, out_p, loads = [], [], []
    for p in range(n):
        bidx = torch.cat([bparts[p], shared]) if shared.numel() else bparts[p]
        pidx = pparts[p]
        loads.append(int(bidx.numel() + pidx.numel()))
        if len(pidx) == 0:
            continue
        sb, sp = hashing.hash_join(bkey[bidx], pkey[pidx], how=how,
                                   build_valid=None if bvalid is None else bvalid[bidx],
                                   probe_valid=None if pvalid is None else pvalid[pidx])
        out_b.append(torch.where(sb >= 0, bidx[sb.clamp(min=0)], -1) if len(bidx) else torch.full_like(sb, -1))
        out_p.append(pidx[sp])
    report.loads = loads
    if not out_b:
        e = torch.zeros(0, dtype=torch.int64, device=dev)
        return e, e.clone(), report
    bi, pi = torch.cat(out_b), torch.cat(out_p)
    order = torch.argsort(pi * (len(bkey) + 1) + (bi + 1))
    return bi[order], pi[order], report

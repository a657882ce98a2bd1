"""Bench cases for the hash family: equi-joins and group-by on int32 keys, segment_reduce of int64
values (16 bytes a row: the value and its group id).

Bytes are the fewest the op must move: each key read once, each output index
(int64) written once; a join writes two indices per pair, a group-by one id
per row plus the unique keys. "FLOPs" count tuples (one hash and compare per
build or probe row), so the entry's ``tflops`` times 1000 reads as
G tuples/s, the unit of issue 8's goal (10M ⋈ 100M: >= 20 G tuples/s).

A case's output is the two index tensors concatenated (the bench compares one
tensor with the reference's). Peer: torch eager (sort + searchsorted for the
join, ``torch.unique`` for the group-by). No torch.compile peer: both outputs
have data-dependent sizes, where dynamo graph-breaks to eager anyway.
"""

from __future__ import annotations

import torch

from opforge.bench.case import BenchCase
from opforge.ops import hashing as H

INDEX_BYTES = 8


def join_case(n_build: int, n_probe: int, *, distinct: int | None = None, how: str = "inner",
              label: str | None = None) -> BenchCase:
    """``distinct=None``: unique build keys (a permutation of the even numbers
    below 2 * n_build) and probe keys uniform below 2 * n_build: about half the
    probes hit one row. Else build keys uniform in ``[0, distinct)`` (duplicates)
    and probe keys in ``[0, 2 * distinct)``."""
    space = 2 * (distinct if distinct is not None else n_build)
    hit, dup = 0.5, (n_build / distinct if distinct else 1.0)
    pairs = int(n_probe * {"inner": hit * dup, "left": hit * dup + 1 - hit, "semi": hit, "anti": 1 - hit}[how])

    def make(dev):
        g = torch.Generator(device="cpu").manual_seed(8)
        if distinct is None:
            b = (torch.randperm(n_build, generator=g, dtype=torch.int32) * 2).to(dev)
        else:
            b = torch.randint(0, distinct, (n_build,), generator=g, dtype=torch.int32).to(dev)
        p = torch.randint(0, space, (n_probe,), generator=g, dtype=torch.int32).to(dev)
        return (b, p)

    def run(b, p):
        return torch.cat(H.hash_join(b, p, how=how))

    def reference(b, p):
        return torch.cat(H.REFERENCE["hash_join"](b, p, how))

    dup_label = f" dup~{n_build // distinct}" if distinct else ""
    return BenchCase(
        op="hash_join", label=label or f"{n_build}x{n_probe} {how}{dup_label}",
        dtype=torch.int32, make_args=make, run=run, reference=reference,
        flops=n_build + n_probe, nbytes=4 * (n_build + n_probe) + 2 * INDEX_BYTES * pairs,
        peers={"torch eager": reference}, op_args=lambda b, p: (b, p, how, None, None),
    )


def group_by_case(n: int, groups: int, *, label: str | None = None) -> BenchCase:
    def make(dev):
        g = torch.Generator(device="cpu").manual_seed(9)
        return (torch.randint(0, groups, (n,), generator=g, dtype=torch.int32).to(dev),)

    def run(k):
        return torch.cat([t.to(torch.int64) for t in H.group_by(k)])

    def reference(k):
        gid, uk, _ = H.REFERENCE["group_by"](k)
        return torch.cat([gid, uk.to(torch.int64)])

    return BenchCase(
        op="group_by", label=label or f"{n} groups~{groups}", dtype=torch.int32, make_args=make, run=run,
        reference=reference, flops=n, nbytes=4 * n + INDEX_BYTES * n + 4 * min(groups, n),
        peers={"torch eager": reference}, op_args=lambda k: (k, None),
    )


def segment_case(n: int, groups: int, op: str, *, runs: bool = False, label: str | None = None) -> BenchCase:
    """``op`` of ``n`` int64 values into ``groups`` groups. ``runs``: the ids come in sorted runs of
    about ``n / groups`` rows (a stream batch's window numbers), else uniformly at random."""
    def make(dev):
        g = torch.Generator(device="cpu").manual_seed(10)
        ids = torch.randint(0, groups, (n,), generator=g, dtype=torch.int64)
        if runs:
            ids = ids.sort().values
        return (torch.randint(0, 10_000, (n,), generator=g, dtype=torch.int64).to(dev), ids.to(dev))

    def run(v, ids):
        return H.segment_reduce(v, ids, groups, op)

    def reference(v, ids):
        return H.REFERENCE["segment_reduce"](v, ids, groups, op)

    def scatter(v, ids):
        how = {"sum": "sum", "max": "amax", "min": "amin"}[op]
        return torch.zeros(groups, dtype=v.dtype, device=v.device).scatter_reduce_(0, ids, v, how, include_self=False)

    return BenchCase(
        op="segment_reduce", label=label or f"{n}->{groups} {op}{' runs' if runs else ''}", dtype=torch.int64,
        make_args=make, run=run, reference=reference, flops=n, nbytes=16 * n + 8 * groups,
        peers={"torch eager": reference, "torch scatter_reduce": scatter},
        op_args=lambda v, ids: (v, ids, groups, op, None, False), upcast_reference=False,
    )


def cases(device: torch.device, quick: bool) -> list[BenchCase]:
    """Issue 8's join (10M ⋈ 100M, unique build keys, ~50% hits), a join with
    duplicates, group-by of 100M rows into few and many groups, and segment_reduce over ids in
    runs (Nexmark q7's windows) and at random."""
    if quick or device.type != "cuda":
        return [
            join_case(5000, 20000),
            join_case(2000, 8000, distinct=500),
            join_case(5000, 20000, how="semi"),
            group_by_case(20000, 100),
            segment_case(20000, 84, "max", runs=True),
        ]
    return [
        join_case(10_000_000, 100_000_000),
        join_case(1_000_000, 10_000_000, distinct=250_000),
        join_case(10_000_000, 100_000_000, how="left"),
        join_case(10_000_000, 100_000_000, how="semi"),
        group_by_case(100_000_000, 1_000),
        group_by_case(100_000_000, 10_000_000),
        segment_case(8 << 20, 84, "max", runs=True),  # Nexmark q7: a batch's bids by window
        segment_case(8 << 20, 84, "max"),
        segment_case(100_000_000, 16, "sum"),
        segment_case(100_000_000, 1_000, "sum"),
    ]

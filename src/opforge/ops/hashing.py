"""Relational ops for the SQL engine: ``opforge.hash_join``, ``opforge.group_by``
and ``opforge.segment_reduce`` (hash aggregation = group_by, then segment_reduce).

Keys: one 1-D int32 or int64 column per side (a join of int32 with int64
compares as int64). Several key columns are combined exactly by the caller
before the call, e.g. ``group_by`` each column over both sides and pack the
dense ids (``g1 * G2 + g2``); no lossy hash of a tuple is ever used as a key.
NULL keys are given by a bool validity mask (True = present).

``hash_join(build_keys, probe_keys, how=)`` returns ``(build_index,
probe_index)``, int64:

* ``inner``: every matching pair, duplicates on both sides;
* ``left``: inner pairs plus ``(-1, p)`` for each probe row p with no match;
* ``semi``: each probe row with a match, once, beside its smallest matching build row;
* ``anti``: each probe row with no match, beside -1.

NULL keys never match (a probe row with a NULL key is a ``left``/``anti``
row). Output order, for every variant: by probe row, then by build row.

``group_by(keys, valid=None)`` returns ``(group_ids, unique_keys)``: dense
int64 group ids ``0..G-1`` numbered by first occurrence (the group of row 0
is 0, the next new key gets 1, ...), and each group's key. With ``valid``,
all NULL rows form one group (also placed by first occurrence) and a third
tensor ``unique_valid`` (False for that group, whose key reads 0) is returned.

``segment_reduce(values, group_ids, num_groups, op)`` folds 1-D values
(fp32, fp64, int32, int64) into ``num_groups`` groups by id: ``sum`` (floats
keep their dtype, integers sum to int64), ``min``/``max`` (values' dtype; 0
for a group with no rows: read ``count`` to tell it from a real 0, as SQL's
NULL), ``count`` (int64). ``valid`` skips NULL values; an id outside ``[0,
num_groups)`` raises (one device reduction and host sync a call; the
engines' ``segment_reduce_dense``, whose ids come dense from ``group_by``,
skips it, and the kernels skip such rows: never an out-of-bounds write). The Triton
variant folds with atomics (fp32 sums in fp32: the order, hence the last bits,
vary run to run on a GPU); ``deterministic=True`` sends float sums to the
reference, which sums in fp64 in row order (rows sorted by group, stable,
then ``torch.segment_reduce``) and rounds once.

Sizes. The pair count of a join and the group count are known only after a
pass over the data: each op makes one device-to-host sync to size its output
(``compact`` makes it for semi/anti and the unique keys).

Variants, in dispatch order: ``triton_hash`` (open-addressing table built
with atomic compare-and-swap, linear probing; join: count pass, exclusive
scan, write pass; when no probe row meets more than one build row, its match is
the row that owns the slot; otherwise the build side's duplicates are grouped
by a stable sort of the build rows' slot ids, so pairs come out in build-row
order, and probe rows with many matches are written output-parallel),
``torch_sort`` (sort + searchsorted / unique, CUDA: the peer) and
``reference`` (the same plain-torch sort algorithm on any device: the oracle
and the CPU fallback). ``segment_reduce``: ``triton_private`` (at most 32
groups: per-program accumulators), ``triton_atomic`` (one atomic per row, or
per block when its rows share an id; few groups over many rows add into up
to 64 copies of the groups, folded after), ``torch_sort``, ``reference``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from opforge.kernels import hashing as K
from opforge.ops.library import KEY_DTYPES, check_keys, check_valid, define, direct_ok
from opforge.ops.compact import compact
from opforge.ops.scan import cumsum
from opforge.runtime import dispatch, registry
from opforge.runtime.registry import Spec
from opforge.runtime.shapes import bucket_size

HOWS = ("inner", "left", "semi", "anti")


# ---------------------------------------------------------------------------
# Reference semantics (plain torch: sort + searchsorted, unique)
# ---------------------------------------------------------------------------
def expand_runs(lo: torch.Tensor, counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(row, position)`` pairs: row ``i`` with positions ``lo[i] .. lo[i] + counts[i] - 1``,
    row-major (the sort-merge joins of the SQL engine and the stream's columnar
    joins). One host sync: the pair count."""
    dev = lo.device
    total = int(counts.sum()) if counts.numel() else 0
    rows = torch.repeat_interleave(torch.arange(len(lo), device=dev), counts, output_size=total)
    starts = torch.cumsum(counts, 0) - counts
    within = torch.arange(total, device=dev) - starts[rows]
    return rows, lo[rows] + within


def direct_groups(codes: torch.Tensor, code_range: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(present_codes, inverse)`` of int codes in ``[0, code_range)``, without hashing or sorting:
    mark the codes present in a direct-address table, an inclusive prefix sum ranks them. Groups
    come in code order. For ranges near the row count (the SQL engine's packed keys, the stream's
    (key, window) codes); one host sync, the group count (``nonzero``)."""
    present = torch.zeros(code_range, dtype=torch.bool, device=codes.device)
    present[codes] = True
    rank = torch.cumsum(present, 0) - 1
    return torch.nonzero(present).flatten(), rank[codes]


def _common_dtype(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if a.dtype == b.dtype:
        return a, b
    return a.to(torch.int64), b.to(torch.int64)


def _join_sorted(build_keys, probe_keys, how="inner", build_valid=None, probe_valid=None):
    """Sort the valid build rows by key (stable: equal keys stay in row order);
    each probe key's matches are the run ``[lo, hi)`` found by binary search."""
    dev = probe_keys.device
    b, p = build_keys.to(torch.int64), probe_keys.to(torch.int64)
    rows_b = torch.arange(b.numel(), device=dev)
    if build_valid is not None:
        rows_b = rows_b[build_valid]
    sorted_keys, order = torch.sort(b[rows_b], stable=True)
    perm = rows_b[order]
    lo = torch.searchsorted(sorted_keys, p, right=False)
    count = torch.searchsorted(sorted_keys, p, right=True) - lo
    if probe_valid is not None:
        count = torch.where(probe_valid, count, 0)
    rows_p = torch.arange(p.numel(), device=dev)
    if how in ("semi", "anti"):
        keep = count > 0 if how == "semi" else count == 0
        pi = rows_p[keep]
        if how == "anti" or perm.numel() == 0:
            return torch.full_like(pi, -1), pi
        return perm[lo[pi].clamp(max=perm.numel() - 1)], pi
    out_count = count if how == "inner" else count.clamp(min=1)
    pi = torch.repeat_interleave(rows_p, out_count)
    starts = torch.cumsum(out_count, 0) - out_count
    within = torch.arange(pi.numel(), device=dev) - starts[pi]
    matched = count[pi] > 0
    if perm.numel() == 0:
        return torch.full_like(pi, -1), pi
    at = (lo[pi] + within).clamp(max=perm.numel() - 1)
    return torch.where(matched, perm[at], -1), pi


def _group_by_sorted(keys, valid=None):
    """``torch.unique`` (sorted), then groups renumbered by their first row."""
    dev = keys.device
    n = keys.numel()
    uniq, inverse = torch.unique(keys, sorted=True, return_inverse=True)
    if valid is not None:  # NULL rows: one extra group after the sorted ones
        inverse = torch.where(valid, inverse, uniq.numel())
        uniq = torch.cat([uniq, uniq.new_zeros(1)])
    G = uniq.numel()
    first = torch.full((G,), n, dtype=torch.int64, device=dev)
    first.scatter_reduce_(0, inverse, torch.arange(n, device=dev), "amin")
    present = first < n
    order = torch.argsort(first)[: int(present.sum())]
    rank = torch.empty(G, dtype=torch.int64, device=dev)
    rank[order] = torch.arange(order.numel(), device=dev)
    unique_keys = uniq[order]
    unique_valid = torch.ones(order.numel(), dtype=torch.bool, device=dev)
    if valid is not None:
        unique_valid = order != G - 1
    return rank[inverse] if n else inverse.to(torch.int64), unique_keys, unique_valid


SEGMENT_OPS = ("sum", "min", "max", "count")
VALUE_DTYPES = frozenset({torch.float32, torch.float64, torch.int32, torch.int64})


def segment_out_dtype(values: torch.Tensor, op: str) -> torch.dtype:
    if op == "count" or (op == "sum" and not values.dtype.is_floating_point):
        return torch.int64
    return values.dtype


def _identity(dtype: torch.dtype, op: str):
    if op in ("sum", "count"):
        return 0
    big = float("inf") if dtype.is_floating_point else torch.iinfo(dtype).max
    return big if op == "min" else (-big if dtype.is_floating_point else torch.iinfo(dtype).min)


def _segment_reduce_ref(values, group_ids, num_groups, op, valid=None, deterministic=False):
    """In float64 (int64 for integers), rows sorted by group (stable), one
    ``torch.segment_reduce`` per group, rounded once. Skipped rows go to an
    extra group ``num_groups`` that is dropped."""
    keep = (group_ids >= 0) & (group_ids < num_groups)
    if valid is not None:
        keep = keep & valid
    g = torch.where(keep, group_ids, num_groups)
    counts = torch.bincount(g, minlength=num_groups + 1)
    if op == "count":
        return counts[:num_groups].clone()
    acc = torch.float64 if values.dtype.is_floating_point else torch.int64
    order = torch.argsort(g, stable=True)
    v = values.to(acc)[order]
    if op == "sum" and acc == torch.float64:
        out = torch.segment_reduce(v, "sum", lengths=counts)
    else:
        reduce = {"sum": "sum", "min": "amin", "max": "amax"}[op]
        out = torch.full((num_groups + 1,), _identity(acc, op), dtype=acc, device=values.device)
        out.scatter_reduce_(0, g[order], v, reduce)
    out = torch.where(counts > 0, out, 0)[:num_groups]
    return out.to(segment_out_dtype(values, op))


REFERENCE = {"hash_join": _join_sorted, "group_by": _group_by_sorted, "segment_reduce": _segment_reduce_ref}


# ---------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------
def validate_join(build_keys, probe_keys, how="inner", build_valid=None, probe_valid=None):
    where = "opforge.hash_join"
    check_keys(where, "build_keys", build_keys)
    check_keys(where, "probe_keys", probe_keys)
    if build_keys.device != probe_keys.device:
        raise ValueError(f"{where}: build_keys is on {build_keys.device} but probe_keys is on {probe_keys.device}")
    if how not in HOWS:
        raise ValueError(f"{where}: how must be one of {HOWS}, got {how!r}")
    check_valid(where, "build_valid", build_valid, build_keys, "build_keys")
    check_valid(where, "probe_valid", probe_valid, probe_keys, "probe_keys")


def validate_group_by(keys, valid=None):
    where = "opforge.group_by"
    check_keys(where, "keys", keys)
    check_valid(where, "valid", valid, keys, "keys")


def validate_segment_reduce(values, group_ids, num_groups, op, valid=None, deterministic=False):
    where = "opforge.segment_reduce"
    if not isinstance(values, torch.Tensor):
        raise TypeError(f"{where}: values must be a torch.Tensor, got {type(values).__name__}")
    if values.dtype not in VALUE_DTYPES:
        raise TypeError(f"{where}: values must be float32, float64, int32 or int64, got {values.dtype}")
    if not isinstance(group_ids, torch.Tensor) or group_ids.dtype != torch.int64:
        raise TypeError(f"{where}: group_ids must be an int64 tensor (from opforge.group_by), got "
                        f"{getattr(group_ids, 'dtype', type(group_ids).__name__)}")
    if values.dim() != 1 or group_ids.shape != values.shape:
        _length_error(values, group_ids)
    if group_ids.device != values.device:
        raise ValueError(f"{where}: group_ids is on {group_ids.device} but values is on {values.device}")
    if isinstance(num_groups, bool) or not isinstance(num_groups, int) or num_groups < 0:
        raise ValueError(f"{where}: num_groups must be an int >= 0, got {num_groups!r}")
    if op not in SEGMENT_OPS:
        raise ValueError(f"{where}: op must be one of {SEGMENT_OPS}, got {op!r}")
    check_valid(where, "valid", valid, values, "values")
    if not isinstance(deterministic, bool):
        raise TypeError(f"{where}: deterministic must be a bool, got {type(deterministic).__name__}")


def _length_error(values, group_ids):
    raise ValueError(f"opforge.segment_reduce: values and group_ids must be 1-D of one length, got "
                     f"{tuple(values.shape)} and {tuple(group_ids.shape)}")


def check_group_ids(values, group_ids, num_groups) -> None:
    """Per call, as dispatch validates once per memo key (which holds only the
    size class): one length per side, and every id in ``[0, num_groups)`` by
    one ``aminmax`` and host sync, skipped while a CUDA graph is captured
    (no sync is allowed there). Other faults are left to the validation."""
    if group_ids.shape != values.shape:
        _length_error(values, group_ids)
    if not group_ids.numel() or type(num_groups) is not int or num_groups < 0 or group_ids.dtype != torch.int64 \
            or (group_ids.is_cuda and torch.cuda.is_current_stream_capturing()):
        return
    lo, hi = (int(t) for t in torch.stack(torch.aminmax(group_ids)).tolist())
    if lo < 0 or hi >= num_groups:
        raise ValueError(f"opforge.segment_reduce: group_ids must lie in [0, {num_groups}), got ids from {lo} to "
                         f"{hi} (mark NULL rows with valid=)")


# ---------------------------------------------------------------------------
# Geometry: the sizes the variants decide on. The memo keys hold sizes as
# classes (bit lengths), so the first call of a class decides for it, as it
# always has; the runners read sizes from their arguments, never from here.
# ---------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class JoinGeometry:
    rows: int  # the hash table's rows: the build side
    probe: int  # probe rows
    how: str


@dataclass(frozen=True, slots=True)
class GroupGeometry:
    rows: int  # the hash table's rows: the keys
    nullable: bool


@dataclass(frozen=True, slots=True)
class SegmentGeometry:
    rows: int
    groups: int
    op: str
    float_sum: bool  # a sum of floats: atomics add them in a varying order
    deterministic: bool


def join_geometry(b, p, how="inner", *rest) -> JoinGeometry:
    return JoinGeometry(b.numel(), p.numel(), how)


def group_geometry(k, v=None) -> GroupGeometry:
    return GroupGeometry(k.numel(), v is not None)


def segment_geometry(values, group_ids, num_groups, op, valid=None, deterministic=False) -> SegmentGeometry:
    return SegmentGeometry(values.numel(), num_groups, op, op == "sum" and values.dtype.is_floating_point,
                           deterministic)


GEOMETRY = {"hash_join": join_geometry, "group_by": group_geometry, "segment_reduce": segment_geometry}


# ---------------------------------------------------------------------------
# Triton variants
# ---------------------------------------------------------------------------
def join_hash_run(g: JoinGeometry, cfg, build_keys, probe_keys, how="inner", build_valid=None, probe_valid=None):
    build_keys, probe_keys = _common_dtype(build_keys, probe_keys)
    dev = probe_keys.device
    n = probe_keys.numel()
    log2cap, owner, tkeys, counts, firsts, slots = K.build_table(
        build_keys, build_valid, cfg, count=True, first=how == "semi")
    slot, cnt = K.probe_count(probe_keys, probe_valid, (log2cap, owner, tkeys, counts), cfg)
    rows = torch.arange(n, device=dev)
    if how == "semi":
        pi = compact(rows, cnt > 0)
        return firsts.gather(0, slot.gather(0, pi)), pi
    if how == "anti":
        pi = compact(rows, cnt == 0)
        return torch.full_like(pi, -1), pi
    out_count = cnt if how == "inner" else cnt.clamp(min=1)
    offsets = cumsum(out_count, 0, exclusive=True)
    if not n:
        return torch.zeros(0, dtype=torch.int64, device=dev), torch.zeros(0, dtype=torch.int64, device=dev)
    heavy = K.HEAVY_ROW_PAIRS
    past = cnt > (heavy if heavy is not None else torch.iinfo(torch.int64).max)
    # the one host sync: the output size, the most matches of a row, and the skew inside the GPU
    total, most, n_heavy, heavy_pairs = torch.stack([offsets[-1] + out_count[-1], cnt.max(), past.sum(),
                                                     torch.where(past, cnt, 0).sum()]).tolist()
    if most <= 1:  # no probe row meets a repeated build key: each match is its slot's one row
        return K.probe_write_single(slot, cnt, offsets, owner, total, how == "left", cfg)
    cap = 1 << log2cap
    starts = cumsum(counts[:cap].contiguous(), 0, exclusive=True)  # counts: one field of the 16-byte entries
    perm = torch.argsort(slots, stable=True)  # rows grouped by slot, in row order; NULL rows (slot CAP) last
    heavy_rows = compact(rows, past, size=n_heavy) if n_heavy else None
    return K.probe_write(slot, cnt, offsets, starts, perm, total, how == "left", cfg, heavy_rows, heavy_pairs)


def group_by_hash_run(g: GroupGeometry, cfg, keys, valid=None):
    log2cap, _, _, _, firsts, slots = K.build_table(keys, valid, cfg, count=False, first=True)
    flags = K.first_flags(slots, firsts, cfg)
    ranks = cumsum(flags, 0, exclusive=True)
    group_ids = K.label(slots, flags, ranks, 1 << log2cap, cfg)
    is_first = flags.bool()
    unique_keys = compact(keys, is_first)  # host sync: the group count
    if valid is None:
        return group_ids, unique_keys, torch.ones(unique_keys.shape, dtype=torch.bool, device=keys.device)
    unique_valid = compact(valid, is_first)
    return group_ids, torch.where(unique_valid, unique_keys, 0), unique_valid


def segment_atomic_run(g: SegmentGeometry, cfg, values, group_ids, num_groups, op, valid=None,
                       deterministic=False):
    dev = values.device
    acc = segment_out_dtype(values, op)
    ident = _identity(acc, op)
    reps = K.replicas_for(group_ids.numel(), num_groups)
    out = torch.full((reps, num_groups), ident, dtype=acc, device=dev)
    counts = torch.zeros((reps, num_groups), dtype=torch.int64, device=dev)
    K.segment_reduce(values, group_ids, valid, out, counts, op, ident, cfg)
    counts = counts.sum(0) if reps > 1 else counts[0]
    if op == "count":
        return counts
    out = {"sum": torch.sum, "min": torch.amin, "max": torch.amax}[op](out, 0) if reps > 1 else out[0]
    if op == "sum":
        return out
    return torch.where(counts > 0, out, 0)


def segment_private_run(g: SegmentGeometry, cfg, values, group_ids, num_groups, op, valid=None,
                        deterministic=False):
    dev = values.device
    acc = segment_out_dtype(values, op)
    ident = _identity(acc, op)
    out = torch.full((num_groups,), ident, dtype=acc, device=dev)
    counts = torch.zeros(num_groups, dtype=torch.int64, device=dev)
    K.segment_reduce_private(values, group_ids, valid, out, counts, op, ident, cfg)
    if op == "count":
        return counts
    if op == "sum":
        return out
    return torch.where(counts > 0, out, 0)


@dataclass(frozen=True)
class Plain:
    """A plain-torch runner (the sort-based peer, the reference): ``fn(*args)``."""

    fn: Callable

    def __call__(self, g, cfg, *args):
        return self.fn(*args)


def table_check(g: JoinGeometry | GroupGeometry) -> str | None:
    if g.rows > K.MAX_BUILD_ROWS:
        return f"{g.rows} rows exceed the table's int32 row ids ({K.MAX_BUILD_ROWS})"
    return None


def table_configs(g: JoinGeometry | GroupGeometry):
    return K.configs(g.rows)


def table_default(g: JoinGeometry | GroupGeometry):
    return K.default_config(g.rows)


def join_bucket(g: JoinGeometry) -> str:
    return f"{bucket_size(g.rows)}x{bucket_size(g.probe)}:{g.how}"


def group_bucket(g: GroupGeometry) -> str:
    return f"{bucket_size(g.rows)}:{'null' if g.nullable else 'dense'}"


def atomic_check(g: SegmentGeometry) -> str | None:
    if g.deterministic and g.float_sum:
        return "atomics add floats in a varying order; deterministic=True takes the reference"
    return None


def private_check(g: SegmentGeometry) -> str | None:
    if g.groups > K.MAX_PRIVATE_GROUPS:
        return f"{g.groups} groups: private accumulators take at most {K.MAX_PRIVATE_GROUPS}"
    return atomic_check(g)


def private_configs(g: SegmentGeometry):
    return [{"BLOCK": b, "PROGRAMS": p} for b in (128, 256, 512) for p in (264, 528, 1056)]


def private_default(g: SegmentGeometry):
    return {"BLOCK": 256, "PROGRAMS": 528}


def atomic_configs(g: SegmentGeometry):
    return [{"BLOCK": b} for b in (256, 512, 1024)]


def atomic_default(g: SegmentGeometry):
    return {"BLOCK": 512}


def segment_bucket(g: SegmentGeometry) -> str:
    return f"{bucket_size(g.rows)}/{bucket_size(g.groups)}:{g.op}"


def specs(name: str) -> list[Spec]:
    """The variants of op ``name``, in dispatch order."""
    if name == "hash_join":
        return [
            Spec("triton_hash", join_hash_run, version=K.HASH_VERSION, check=table_check, configs=table_configs,
                 default_config=table_default, bucket=join_bucket,
                 description="open-addressing table (atomic CAS, linear probing) on the build side; "
                             "probe: count pass, exclusive scan, write pass"),
            Spec("torch_sort", Plain(_join_sorted), kind="vendor", devices=("cuda",), bucket=join_bucket,
                 description="torch sort of the build keys + searchsorted of the probe keys"),
            Spec("reference", Plain(_join_sorted), kind="reference", devices=("cpu", "cuda"),
                 description="plain torch sort + searchsorted (the oracle and the CPU fallback)"),
        ]
    if name == "group_by":
        return [
            Spec("triton_hash", group_by_hash_run, version=K.HASH_VERSION, check=table_check, configs=table_configs,
                 default_config=table_default, bucket=group_bucket,
                 description="open-addressing table with the first row per slot (atomic min); "
                             "ids by an exclusive scan of first-row flags"),
            Spec("torch_sort", Plain(_group_by_sorted), kind="vendor", devices=("cuda",), bucket=group_bucket,
                 description="torch.unique, groups renumbered by first row"),
            Spec("reference", Plain(_group_by_sorted), kind="reference", devices=("cpu", "cuda"),
                 description="plain torch unique (the oracle and the CPU fallback)"),
        ]
    return [
        Spec("triton_private", segment_private_run, version=K.HASH_VERSION, dtypes=VALUE_DTYPES,
             check=private_check, configs=private_configs, default_config=private_default, bucket=segment_bucket,
             description="few groups: each program folds its rows into private per-group accumulators, "
                         "then one atomic per group (not one per row on the same few addresses)"),
        Spec("triton_atomic", segment_atomic_run, version=K.SEGMENT_VERSION, dtypes=VALUE_DTYPES,
             check=atomic_check, configs=atomic_configs, default_config=atomic_default, bucket=segment_bucket,
             description="one atomic add / min / max per row into its group (one per block when its rows "
                         "share an id), and one count; few groups over many rows: into one of up to 64 copies "
                         "of the groups, folded after"),
        Spec("torch_sort", Plain(_segment_reduce_ref), kind="vendor", devices=("cuda",), bucket=segment_bucket,
             description="stable sort by group + torch.segment_reduce / scatter_reduce"),
        Spec("reference", Plain(_segment_reduce_ref), kind="reference", devices=("cpu", "cuda"),
             description="plain torch in float64 / int64 (the oracle and the CPU fallback)"),
    ]


# ---------------------------------------------------------------------------
# Selftest inputs
# ---------------------------------------------------------------------------
def _rand_keys(g, n, lo, hi, dtype, device):
    return torch.randint(lo, hi, (n,), generator=g, dtype=torch.int64).to(dtype).to(device)


def join_samples(device: torch.device) -> list[tuple]:
    """Duplicates on both sides, misses, NULLs, extreme int32/int64 keys, every ``how``."""
    g = torch.Generator(device="cpu").manual_seed(8)
    out = []
    for dtype in KEY_DTYPES:
        info = torch.iinfo(dtype)
        b = _rand_keys(g, 3000, -500, 500, dtype, device)
        p = _rand_keys(g, 5000, -1000, 1000, dtype, device)
        b[:2] = torch.tensor([info.min, info.max], dtype=dtype)
        p[:2] = torch.tensor([info.max, info.min], dtype=dtype)
        bv = (torch.rand(3000, generator=g) > 0.1).to(device)
        pv = (torch.rand(5000, generator=g) > 0.1).to(device)
        for how in HOWS:
            out.append((b, p, how, None, None))
            out.append((b, p, how, bv, pv))
    e = torch.empty(0, dtype=torch.int32, device=device)
    out.append((e, _rand_keys(g, 100, 0, 10, torch.int32, device), "left", None, None))
    out.append((_rand_keys(g, 100, 0, 10, torch.int32, device), e, "inner", None, None))
    return out


def group_by_samples(device: torch.device) -> list[tuple]:
    g = torch.Generator(device="cpu").manual_seed(9)
    out = []
    for dtype in KEY_DTYPES:
        info = torch.iinfo(dtype)
        for groups in (7, 3000, 1 << 20):
            k = _rand_keys(g, 20000, -groups, groups, dtype, device)
            k[5] = info.min
            k[9] = info.max
            out.append((k, None))
            out.append((k, (torch.rand(20000, generator=g) > 0.2).to(device)))
    out.append((torch.empty(0, dtype=torch.int64, device=device), None))
    return out


def segment_samples(device: torch.device) -> list[tuple]:
    """Integer values only: float atomics round in a varying order, so their sums
    are compared with a tolerance in the tests, not bit-exactly here."""
    g = torch.Generator(device="cpu").manual_seed(10)
    out = []
    for dtype in (torch.int32, torch.int64):
        v = torch.randint(-10**6, 10**6, (5000,), generator=g).to(dtype).to(device)
        gid = torch.randint(0, 700, (5000,), generator=g).to(device)
        valid = (torch.rand(5000, generator=g) > 0.1).to(device)
        for op in SEGMENT_OPS:
            out.append((v, gid, 800, op))  # no trailing None: selftest drops None arguments
            out.append((v, gid, 700, op, valid))
            out.append((v, gid % 6, 6, op, valid))  # few groups: private accumulators
    return out


# ---------------------------------------------------------------------------
# Registration: registry entries + torch.library ops
# ---------------------------------------------------------------------------
def _keys_dtype(*tensors):
    return "+".join(sorted({str(t.dtype).replace("torch.", "") for t in tensors}))


def _join_tensors(b, p, how="inner", bv=None, pv=None):
    return (b, p)


def _join_memo_key(b, p, how="inner", bv=None, pv=None):
    return (b.dtype, p.dtype, b.device, b.numel().bit_length(), p.numel().bit_length(), how, bv is None, pv is None)


def _join_dtype_key(b, p, *rest):
    return _keys_dtype(b, p)


def _group_tensors(k, v=None):
    return (k,)


def _group_memo_key(k, v=None):
    return (k.dtype, k.device, k.numel().bit_length(), v is None)


def _group_dtype_key(k, *rest):
    return _keys_dtype(k)


def _segment_tensors(v, g, n, op, valid=None, det=False):
    return (v, g)


def _segment_memo_key(v, g, n, op, valid=None, det=False):
    return (v.dtype, g.dtype, v.device, v.numel().bit_length(), n.bit_length() if isinstance(n, int) else n,
            op, valid is None, det)


def _segment_dtype_key(v, *rest):
    return str(v.dtype).replace("torch.", "")


def _pick(join, group, segment):
    """A per-op field as a function of the op's name."""
    return {"hash_join": join, "group_by": group, "segment_reduce": segment}.__getitem__


OPS = registry.register_family(
    ("hash_join", "group_by", "segment_reduce"), specs, geometry=GEOMETRY.__getitem__,
    reference=REFERENCE.__getitem__,
    tensors=_pick(_join_tensors, _group_tensors, _segment_tensors),
    memo_key=_pick(_join_memo_key, _group_memo_key, _segment_memo_key),
    dtype_key=_pick(_join_dtype_key, _group_dtype_key, _segment_dtype_key),
    validate=_pick(validate_join, validate_group_by, validate_segment_reduce),
    samples=_pick(join_samples, group_by_samples, segment_samples),
    doc=_pick("equi-join of two int key columns: (build_index, probe_index) pairs",
              "dense group ids by first occurrence, and the unique keys",
              "sum / min / max / count of values by dense group id"),
)
JOIN, GROUP_BY, SEGMENT_REDUCE = OPS["hash_join"], OPS["group_by"], OPS["segment_reduce"]


def _define() -> None:
    def join_impl(b, p, how, bv, pv):
        return dispatch.call(JOIN, b, p, how, bv, pv)

    def join_fake(b, p, how, bv, pv):
        validate_join(b, p, how, bv, pv)
        n = torch.library.get_ctx().new_dynamic_size()
        return p.new_empty((n,), dtype=torch.int64), p.new_empty((n,), dtype=torch.int64)

    define("hash_join(Tensor build_keys, Tensor probe_keys, str how, Tensor? build_valid, "
           "Tensor? probe_valid) -> (Tensor, Tensor)", join_impl, join_fake)

    def group_impl(k, v):
        return dispatch.call(GROUP_BY, k, v)

    def group_fake(k, v):
        validate_group_by(k, v)
        g = torch.library.get_ctx().new_dynamic_size()
        return (k.new_empty(k.shape, dtype=torch.int64), k.new_empty((g,)),
                k.new_empty((g,), dtype=torch.bool))

    define("group_by(Tensor keys, Tensor? valid) -> (Tensor, Tensor, Tensor)", group_impl, group_fake)

    def segment_impl(v, g, n, op, valid, det):
        check_group_ids(v, g, n)
        return dispatch.call(SEGMENT_REDUCE, v, g, n, op, valid, det)

    def segment_fake(v, g, n, op, valid, det):
        validate_segment_reduce(v, g, n, op, valid, det)
        return v.new_empty((n,), dtype=segment_out_dtype(v, op))

    define("segment_reduce(Tensor values, Tensor group_ids, int num_groups, str op, Tensor? valid, "
           "bool deterministic) -> Tensor", segment_impl, segment_fake)


_define()


# ---------------------------------------------------------------------------
# Public functions
# ---------------------------------------------------------------------------
def hash_join(build_keys: torch.Tensor, probe_keys: torch.Tensor, *, how: str = "inner",
              build_valid: torch.Tensor | None = None,
              probe_valid: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(build_index, probe_index)`` of the equi-join ``build_keys == probe_keys``;
    ``how`` in inner / left / semi / anti; NULL keys (False in a valid mask)
    never match; pairs ordered by probe row, then build row."""
    if direct_ok(build_keys, probe_keys) and (build_valid is None or type(build_valid) is torch.Tensor) \
            and (probe_valid is None or type(probe_valid) is torch.Tensor):
        return dispatch.call(JOIN, build_keys, probe_keys, how, build_valid, probe_valid)
    validate_join(build_keys, probe_keys, how, build_valid, probe_valid)
    return torch.ops.opforge.hash_join.default(build_keys, probe_keys, how, build_valid, probe_valid)


def group_by(keys: torch.Tensor, valid: torch.Tensor | None = None):
    """``(group_ids, unique_keys)``: int64 ids 0..G-1 by first occurrence and each
    group's key; with ``valid``, NULL rows form one group and ``unique_valid``
    is returned third."""
    if direct_ok(keys, valid):
        out = dispatch.call(GROUP_BY, keys, valid)
    else:
        validate_group_by(keys, valid)
        out = torch.ops.opforge.group_by.default(keys, valid)
    return tuple(out) if valid is not None else (out[0], out[1])


def segment_reduce(values: torch.Tensor, group_ids: torch.Tensor, num_groups: int, op: str = "sum", *,
                   valid: torch.Tensor | None = None, deterministic: bool = False) -> torch.Tensor:
    """``op`` (sum / min / max / count) of ``values`` per group id in
    ``[0, num_groups)`` (another id raises; mark NULL rows with ``valid``);
    NULL values (False in ``valid``) skipped; empty groups read 0;
    ``deterministic=True``: float sums reproducible bit for bit."""
    if direct_ok(values, group_ids) and (valid is None or type(valid) is torch.Tensor):
        check_group_ids(values, group_ids, num_groups)
        return dispatch.call(SEGMENT_REDUCE, values, group_ids, num_groups, op, valid, deterministic)
    validate_segment_reduce(values, group_ids, num_groups, op, valid, deterministic)
    return torch.ops.opforge.segment_reduce.default(values, group_ids, num_groups, op, valid, deterministic)


def segment_reduce_dense(values: torch.Tensor, group_ids: torch.Tensor, num_groups: int, op: str = "sum", *,
                         valid: torch.Tensor | None = None, deterministic: bool = False) -> torch.Tensor:
    """``segment_reduce`` for the engines, whose ids are dense by construction
    (``group_by``, ``direct_groups``, ``torch.unique``): no range check, so no
    host sync. Rows with an id out of range are skipped by every variant."""
    if group_ids.shape != values.shape:  # dispatch validates once per memo key, which holds only the size class
        _length_error(values, group_ids)
    return dispatch.call(SEGMENT_REDUCE, values, group_ids, num_groups, op, valid, deterministic)


__all__ = ["hash_join", "group_by", "segment_reduce", "segment_reduce_dense"]

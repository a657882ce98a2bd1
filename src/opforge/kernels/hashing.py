"""Open-addressing hash table kernels: the build, probe and labelling passes
behind ``opforge.hash_join`` and ``opforge.group_by``.

Table layout. ``2**LOG2CAP`` slots plus one spare at index ``CAP`` (where
masked-off lanes aim their compare-and-swap, since ``tl.atomic_cas`` takes no
mask). A slot is owned by the first build row that claims it: ``owner[slot]``
holds that row + 1 (0 = empty), so any key value is legal, INT_MIN and
INT_MAX included: no key is reserved as the empty marker. The winner also
copies its key (as int64) into the slot; kernels launched later read the copy
instead of chasing ``keys[owner - 1]``. A slot is one 16-byte entry, the owner,
the row count (join builds) and the key side by side, so a probe step reads one
32-byte sector of the table, not one in each of three arrays. Inside the build kernel a
loser compares against ``keys[owner - 1]`` (the input, always visible), never
against the copy, which another program may not have written yet.

Hashing: Fibonacci hashing of the 64-bit key (multiply by 2^64 / phi, keep the
top ``LOG2CAP`` bits), linear probing. ``COLLIDE=1`` sends every key to slot
0: the tests use it to walk long probe chains on purpose.

The table always keeps an empty slot (capacity > distinct keys), so every
probe loop ends. Loops run while any lane of the block is still probing; the
interpreter runs programs one after another, which is fine here: no program
waits on another.

Keys are int32 or int64, loaded as int64. Row indices are int64; ``owner``
is int32, so a build side holds fewer than 2^31 - 1 rows.
"""

from __future__ import annotations

import triton
import triton.language as tl

# Bump when a kernel's code changes: it invalidates tuned entries of that kernel.
HASH_VERSION = "5"  # the table kernels (hash_join, group_by) and segment_reduce_private
SEGMENT_VERSION = "6"  # segment_reduce_kernel (the atomic variant)

_FIB = tl.constexpr(0x9E3779B97F4A7C15)
# One 16-byte entry per slot: int32 owner, int32 count, int64 key (see the module docstring)
ENTRY = tl.constexpr(4)  # int32 words per entry: owner at 4*slot, count at 4*slot + 1
KEY_STEP = tl.constexpr(2)  # int64 words per entry: the key at 2*slot + 1

# Largest build side the int32 owner array addresses.
MAX_BUILD_ROWS = (1 << 31) - 2
# Join skew inside the GPU: probe rows with more pairs than this go to the output-parallel
# kernel (programs of HEAVY_BLOCK pairs). None: every row in the row-parallel kernel (the
# plain join that benchmarks/join_skew.py compares against).
HEAVY_ROW_PAIRS: int | None = 32
HEAVY_BLOCK = 1024


@triton.jit
def _home(k, LOG2CAP: tl.constexpr, COLLIDE: tl.constexpr):
    """The first slot a key probes (int64)."""
    if COLLIDE:
        return tl.zeros_like(k)
    h = k.to(tl.uint64, bitcast=True) * _FIB
    return (h >> (64 - LOG2CAP)).to(tl.int64)


@triton.jit
def insert_kernel(
    keys_ptr, valid_ptr, owner_ptr, tkeys_ptr, count_ptr, first_ptr, slot_ptr, n,
    HAS_VALID: tl.constexpr, COUNT: tl.constexpr, FIRST: tl.constexpr,
    LOG2CAP: tl.constexpr, COLLIDE: tl.constexpr, BLOCK: tl.constexpr,
):
    """Insert each row's key; write the row's slot (``CAP`` for a NULL key).
    ``COUNT``: count rows per slot (join build). ``FIRST``: the smallest row
    per slot (group-by, first occurrence), NULL rows into slot ``CAP``."""
    CAP: tl.constexpr = 1 << LOG2CAP
    rows = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inb = rows < n
    k = tl.load(keys_ptr + rows, mask=inb, other=0).to(tl.int64)
    active = inb
    if HAS_VALID:
        active = active & (tl.load(valid_ptr + rows, mask=inb, other=0) != 0)
    pos = _home(k, LOG2CAP, COLLIDE)
    slot = tl.full([BLOCK], CAP, tl.int64)
    me = (rows + 1).to(tl.int32)
    zero = tl.zeros([BLOCK], tl.int32)
    while tl.max(active.to(tl.int32), 0) > 0:
        target = tl.where(active, pos, CAP)
        old = tl.atomic_cas(owner_ptr + target * ENTRY, zero, tl.where(active, me, zero))
        won = active & (old == 0)
        tl.store(tkeys_ptr + pos * KEY_STEP, k, mask=won)
        taken = active & (old != 0)
        other = tl.load(keys_ptr + (old.to(tl.int64) - 1), mask=taken, other=0).to(tl.int64)
        done = won | (taken & (other == k))
        slot = tl.where(done, pos, slot)
        active = active & ~done
        pos = tl.where(active, (pos + 1) & (CAP - 1), pos)
    tl.store(slot_ptr + rows, slot, mask=inb)
    placed = inb & (slot < CAP)
    if COUNT:
        tl.atomic_add(count_ptr + slot * ENTRY, tl.full([BLOCK], 1, tl.int32), mask=placed)
    if FIRST:
        tl.atomic_min(first_ptr + slot, rows, mask=inb)


@triton.jit
def probe_count_kernel(
    keys_ptr, valid_ptr, owner_ptr, tkeys_ptr, count_ptr, slot_ptr, cnt_ptr, n,
    HAS_VALID: tl.constexpr, LOG2CAP: tl.constexpr, COLLIDE: tl.constexpr, BLOCK: tl.constexpr,
):
    """For each probe row: the slot holding its key (-1: none) and the number
    of build rows with that key (0 for a miss or a NULL key)."""
    CAP: tl.constexpr = 1 << LOG2CAP
    rows = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inb = rows < n
    k = tl.load(keys_ptr + rows, mask=inb, other=0).to(tl.int64)
    active = inb
    if HAS_VALID:
        active = active & (tl.load(valid_ptr + rows, mask=inb, other=0) != 0)
    pos = _home(k, LOG2CAP, COLLIDE)
    found = tl.full([BLOCK], -1, tl.int64)
    while tl.max(active.to(tl.int32), 0) > 0:
        o = tl.load(owner_ptr + pos * ENTRY, mask=active, other=0)
        full = active & (o != 0)
        tk = tl.load(tkeys_ptr + pos * KEY_STEP, mask=full, other=0)
        hit = full & (tk == k)
        found = tl.where(hit, pos, found)
        active = full & ~hit
        pos = tl.where(active, (pos + 1) & (CAP - 1), pos)
    hit = found >= 0
    c = tl.load(count_ptr + found * ENTRY, mask=hit, other=0).to(tl.int64)
    tl.store(slot_ptr + rows, found, mask=inb)
    tl.store(cnt_ptr + rows, c, mask=inb)


@triton.jit
def probe_write_kernel(
    slot_ptr, cnt_ptr, off_ptr, start_ptr, perm_ptr, out_b_ptr, out_p_ptr, n, heavy,
    LEFT: tl.constexpr, BLOCK: tl.constexpr,
):
    """Write each probe row's pairs at its offset: the matching build rows in
    ``perm`` order (ascending build row), or ``(-1, row)`` for a left-join miss.
    Rows with more than ``heavy`` pairs are left to :func:`heavy_write_kernel`."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inb = rows < n
    s = tl.load(slot_ptr + rows, mask=inb, other=-1)
    c = tl.load(cnt_ptr + rows, mask=inb, other=0)
    o = tl.load(off_ptr + rows, mask=inb, other=0)
    st = tl.load(start_ptr + s, mask=s >= 0, other=0)
    if LEFT:
        miss = inb & (c == 0)
        tl.store(out_b_ptr + o, tl.full([BLOCK], -1, tl.int64), mask=miss)
        tl.store(out_p_ptr + o, rows, mask=miss)
    c = tl.where(c > heavy, 0, c)  # the heavy rows' pairs: heavy_write_kernel
    most = tl.max(c, 0)
    for j in range(0, most):
        w = inb & (j < c)
        b = tl.load(perm_ptr + st + j, mask=w, other=0)
        tl.store(out_b_ptr + o + j, b, mask=w)
        tl.store(out_p_ptr + o + j, rows, mask=w)


@triton.jit
def probe_write_single_kernel(slot_ptr, cnt_ptr, off_ptr, owner_ptr, out_b_ptr, out_p_ptr, n,
                              LEFT: tl.constexpr, BLOCK: tl.constexpr):
    """Pass 2 when no probe row matches more than one build row (unique build keys, the usual
    key-foreign-key join): the build row is the slot's owner (the row that inserted the key), so
    the build rows need no grouping by slot (no sort, no scan over the table)."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inb = rows < n
    s = tl.load(slot_ptr + rows, mask=inb, other=-1)
    c = tl.load(cnt_ptr + rows, mask=inb, other=0)
    o = tl.load(off_ptr + rows, mask=inb, other=0)
    hit = inb & (c > 0)
    b = tl.load(owner_ptr + s * ENTRY, mask=hit, other=0).to(tl.int64) - 1
    w = hit
    if LEFT:  # a probe row without a match: (-1, row)
        w = w | (inb & (c == 0))
    tl.store(out_b_ptr + o, tl.where(hit, b, -1), mask=w)
    tl.store(out_p_ptr + o, rows, mask=w)


@triton.jit
def heavy_write_kernel(row_ptr, hoff_ptr, nh, total, slot_ptr, off_ptr, start_ptr, perm_ptr, out_b_ptr, out_p_ptr,
                       LOG2: tl.constexpr, BLOCK: tl.constexpr):
    """The heavy probe rows' pairs, output-parallel: the heavy rows' pairs laid end to end
    (``hoff``: where each row's start, ``nh + 1`` entries), each program writes ``BLOCK`` of them,
    every lane finding its row by binary search. A row with many matches is spread over many
    programs, no program idles, and consecutive lanes store to consecutive addresses."""
    t = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    w = t < total
    lo = tl.zeros([BLOCK], tl.int64)
    hi = tl.zeros([BLOCK], tl.int64) + nh
    for _ in range(LOG2):  # invariant: hoff[lo] <= t < hoff[hi]
        mid = (lo + hi) // 2
        below = tl.load(hoff_ptr + mid, mask=w, other=0) <= t
        lo = tl.where(below, mid, lo)
        hi = tl.where(below, hi, mid)
    row = tl.load(row_ptr + lo, mask=w, other=0)
    j = t - tl.load(hoff_ptr + lo, mask=w, other=0)
    o = tl.load(off_ptr + row, mask=w, other=0)
    st = tl.load(start_ptr + tl.load(slot_ptr + row, mask=w, other=0), mask=w, other=0)
    b = tl.load(perm_ptr + st + j, mask=w, other=0)
    tl.store(out_b_ptr + o + j, b, mask=w)
    tl.store(out_p_ptr + o + j, row, mask=w)


@triton.jit
def first_flags_kernel(slot_ptr, first_ptr, flag_ptr, n, BLOCK: tl.constexpr):
    """A row is its group's first when it is the smallest row of its slot."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inb = rows < n
    s = tl.load(slot_ptr + rows, mask=inb, other=0)
    f = tl.load(first_ptr + s, mask=inb, other=-1)
    tl.store(flag_ptr + rows, (f == rows).to(tl.int8), mask=inb)


@triton.jit
def label_kernel(slot_ptr, flag_ptr, rank_ptr, gslot_ptr, gid_ptr, n, PHASE: tl.constexpr, BLOCK: tl.constexpr):
    """Phase 0: each group's first row publishes its rank (the group id) to its
    slot. Phase 1 (a later launch): every row reads its slot's group id."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inb = rows < n
    s = tl.load(slot_ptr + rows, mask=inb, other=0)
    if PHASE == 0:
        f = tl.load(flag_ptr + rows, mask=inb, other=0) != 0
        r = tl.load(rank_ptr + rows, mask=inb & f, other=0)
        tl.store(gslot_ptr + s, r, mask=inb & f)
    else:
        g = tl.load(gslot_ptr + s, mask=inb, other=0)
        tl.store(gid_ptr + rows, g, mask=inb)


# ---------------------------------------------------------------------------
# Launch helpers
# ---------------------------------------------------------------------------
def default_config(n_build: int) -> dict:
    return {"BLOCK": 256, "CAP_FACTOR": 2, "COLLIDE": 0}


def configs(n_build: int) -> list[dict]:
    return [{"BLOCK": b, "CAP_FACTOR": f, "COLLIDE": 0} for b in (128, 256, 512, 1024) for f in (2, 4)]


def log2_capacity(n: int, factor: int) -> int:
    """Capacity: a power of two >= factor * n, and > n so an empty slot always remains."""
    want = max(factor * n, n + 1, 2)
    return (want - 1).bit_length()


def _grid(n: int, block: int):
    return (triton.cdiv(max(n, 1), block),)


def build_table(keys, valid, cfg, *, count: bool, first: bool):
    """Insert ``keys``: returns ``(log2cap, owner, tkeys, counts, firsts, slots)``
    (``counts``/``firsts`` None unless asked). ``slots[i]`` is row i's slot,
    ``CAP`` for a NULL key."""
    import torch

    n = keys.numel()
    dev = keys.device
    log2cap = log2_capacity(n, cfg["CAP_FACTOR"])
    cap = 1 << log2cap
    table = torch.zeros((cap + 1) * 4, dtype=torch.int32, device=dev)
    entries = table.view(cap + 1, 4)
    owner, counts = entries[:, 0], entries[:, 1]  # strided views: kernels index entry * ENTRY
    tkeys = table.view(torch.int64).view(cap + 1, 2)[:, 1]
    firsts = torch.full((cap + 1,), n, dtype=torch.int64, device=dev) if first else owner
    slots = torch.empty(n, dtype=torch.int64, device=dev)
    if n:
        insert_kernel[_grid(n, cfg["BLOCK"])](
            keys, valid if valid is not None else keys, owner, tkeys, counts, firsts, slots, n,
            HAS_VALID=valid is not None, COUNT=count, FIRST=first,
            LOG2CAP=log2cap, COLLIDE=cfg["COLLIDE"], BLOCK=cfg["BLOCK"],
        )
    return log2cap, owner, tkeys, (counts if count else None), (firsts if first else None), slots


def probe_count(keys, valid, table, cfg):
    """Pass 1 of the probe: ``(slot, count)`` per probe row."""
    import torch

    log2cap, owner, tkeys, counts = table
    n = keys.numel()
    slot = torch.empty(n, dtype=torch.int64, device=keys.device)
    cnt = torch.empty(n, dtype=torch.int64, device=keys.device)
    if n:
        probe_count_kernel[_grid(n, cfg["BLOCK"])](
            keys, valid if valid is not None else keys, owner, tkeys, counts, slot, cnt, n,
            HAS_VALID=valid is not None, LOG2CAP=log2cap, COLLIDE=cfg["COLLIDE"], BLOCK=cfg["BLOCK"],
        )
    return slot, cnt


def probe_write(slot, cnt, offsets, starts, perm, total, left, cfg, heavy_rows=None, heavy_pairs=0):
    """Pass 2 of the probe: the ``total`` pairs, by probe row then build row.

    ``heavy_rows``: probe rows with more than :data:`HEAVY_ROW_PAIRS` pairs (``heavy_pairs``
    in all), written by the output-parallel kernel. Without it one program of ``BLOCK`` rows
    loops as often as its row with the most matches: a build key with thousands of rows
    (skew) makes every program that meets it run that long with one thread busy."""
    import torch

    dev = slot.device
    out_b = torch.empty(total, dtype=torch.int64, device=dev)
    out_p = torch.empty(total, dtype=torch.int64, device=dev)
    n = slot.numel()
    split = heavy_rows is not None and heavy_rows.numel() > 0
    if n and total:
        probe_write_kernel[_grid(n, cfg["BLOCK"])](slot, cnt, offsets, starts, perm, out_b, out_p, n,
                                                   HEAVY_ROW_PAIRS if split else 2**62 - 1,
                                                   LEFT=left, BLOCK=cfg["BLOCK"])
    if n and total and split:
        nh = heavy_rows.numel()
        hoff = torch.zeros(nh + 1, dtype=torch.int64, device=dev)
        torch.cumsum(cnt.gather(0, heavy_rows), 0, out=hoff[1:])
        heavy_write_kernel[_grid(heavy_pairs, HEAVY_BLOCK)](heavy_rows, hoff, nh, heavy_pairs, slot, offsets, starts,
                                                            perm, out_b, out_p, LOG2=max(1, nh.bit_length()),
                                                            BLOCK=HEAVY_BLOCK)
    return out_b, out_p


def probe_write_single(slot, cnt, offsets, owner, total, left, cfg):
    """Pass 2 of the probe when every probe row has at most one match (see
    :func:`probe_write_single_kernel`): the ``total`` pairs, by probe row."""
    import torch

    dev = slot.device
    out_b = torch.empty(total, dtype=torch.int64, device=dev)
    out_p = torch.empty(total, dtype=torch.int64, device=dev)
    n = slot.numel()
    if n and total:
        probe_write_single_kernel[_grid(n, cfg["BLOCK"])](slot, cnt, offsets, owner, out_b, out_p, n,
                                                          LEFT=left, BLOCK=cfg["BLOCK"])
    return out_b, out_p


def first_flags(slots, firsts, cfg):
    import torch

    n = slots.numel()
    flags = torch.empty(n, dtype=torch.int8, device=slots.device)
    if n:
        first_flags_kernel[_grid(n, cfg["BLOCK"])](slots, firsts, flags, n, BLOCK=cfg["BLOCK"])
    return flags


def label(slots, flags, ranks, cap, cfg):
    """Group id per row from the ranks of the first rows (two launches: the
    second must see every slot's id)."""
    import torch

    n = slots.numel()
    gslot = torch.empty(cap + 1, dtype=torch.int64, device=slots.device)
    gid = torch.empty(n, dtype=torch.int64, device=slots.device)
    if n:
        for phase in (0, 1):
            label_kernel[_grid(n, cfg["BLOCK"])](slots, flags, ranks, gslot, gid, n, PHASE=phase,
                                                 BLOCK=cfg["BLOCK"])
    return gid


# ---------------------------------------------------------------------------
# Aggregation by group id (atomics)
# ---------------------------------------------------------------------------
SEGMENT_OPS = {"sum": 0, "min": 1, "max": 2, "count": 3}


@triton.jit
def segment_reduce_kernel(v_ptr, g_ptr, valid_ptr, out_ptr, cnt_ptr, n, num_groups, ident, replicas,
                          OP: tl.constexpr, HAS_VALID: tl.constexpr, BLOCK: tl.constexpr):
    """Fold each row into its group's accumulator with one atomic; count the
    rows per group. Rows whose id is outside ``[0, num_groups)`` are skipped.
    ``out`` and ``cnt`` hold ``replicas`` copies of the groups; program ``p``
    adds into copy ``p % replicas``, so the atomics on one group spread over
    that many addresses (the caller folds the copies). A block whose rows all
    have one id (ids clustered or sorted: a stream's window numbers, a sorted
    column) is folded in registers first and makes one atomic, not ``BLOCK``
    on the same address. ``ident``: the op's identity in the output dtype."""
    pid = tl.program_id(0).to(tl.int64)
    start = pid * BLOCK
    rows = start + tl.arange(0, BLOCK)
    inb = rows < n
    g = tl.load(g_ptr + rows, mask=inb, other=-1)
    m = inb & (g >= 0) & (g < num_groups)
    if HAS_VALID:
        m = m & (tl.load(valid_ptr + rows, mask=inb, other=0) != 0)
    base = (pid % replicas) * num_groups
    out_ptr += base
    cnt_ptr += base
    first = tl.load(g_ptr + start)
    same = tl.where(inb, g, first)
    if tl.min(same, axis=0) == tl.max(same, axis=0):
        cnt = tl.sum(m.to(tl.int64), axis=0)
        tl.atomic_add(cnt_ptr + first, cnt, mask=cnt > 0)
        if OP != 3:
            v = tl.load(v_ptr + rows, mask=m, other=0).to(out_ptr.dtype.element_ty)
            if OP == 0:
                tl.atomic_add(out_ptr + first, tl.sum(tl.where(m, v, 0), axis=0), mask=cnt > 0)
            elif OP == 1:
                tl.atomic_min(out_ptr + first, tl.min(tl.where(m, v, ident), axis=0), mask=cnt > 0)
            else:
                tl.atomic_max(out_ptr + first, tl.max(tl.where(m, v, ident), axis=0), mask=cnt > 0)
    else:
        tl.atomic_add(cnt_ptr + g, tl.full([BLOCK], 1, tl.int64), mask=m)
        if OP != 3:
            v = tl.load(v_ptr + rows, mask=m, other=0).to(out_ptr.dtype.element_ty)
            if OP == 0:
                tl.atomic_add(out_ptr + g, v, mask=m)
            elif OP == 1:
                tl.atomic_min(out_ptr + g, v, mask=m)
            else:
                tl.atomic_max(out_ptr + g, v, mask=m)


# Replicas of the accumulators for the atomic kernel: at most this many slots in all (16 bytes each with
# the count), and only when each copy still gets this many rows per group on average.
REPLICA_SLOTS = 1 << 16
MAX_REPLICAS = 64
ROWS_PER_REPLICA_SLOT = 16


def replicas_for(n: int, num_groups: int) -> int:
    """How many copies of the ``num_groups`` accumulators ``segment_reduce`` adds into: many for
    few groups and many rows (per-row atomics on a few addresses serialize), 1 when the groups
    alone spread the atomics or the rows are few."""
    if num_groups < 1:
        return 1
    r = min(MAX_REPLICAS, REPLICA_SLOTS // num_groups, n // (num_groups * ROWS_PER_REPLICA_SLOT))
    return 1 << (r.bit_length() - 1) if r > 1 else 1


# Few groups: private accumulators per program instead of one atomic per row (SQL's GROUP BY of a
# flag or a status, TPC-H q1: 59M rows into 4 groups took 497 ms as per-row atomics on 4 addresses).
MAX_PRIVATE_GROUPS = 32


@triton.jit
def segment_reduce_private_kernel(v_ptr, g_ptr, valid_ptr, out_ptr, cnt_ptr, n, num_groups, tiles, ident,
                                  OP: tl.constexpr, HAS_VALID: tl.constexpr, G: tl.constexpr,
                                  BLOCK: tl.constexpr):
    """Each program folds ``tiles`` blocks of rows into ``G`` private accumulators (a [BLOCK, G]
    one-hot of the group ids, reduced over the rows), then adds them to the outputs with one
    atomic per group it saw. ``ident``: the op's identity in the output dtype."""
    pid = tl.program_id(0).to(tl.int64)
    groups = tl.arange(0, G)
    acc = tl.full([G], ident, out_ptr.dtype.element_ty)
    cnt = tl.zeros([G], tl.int64)
    for t in range(tiles):
        rows = (pid * tiles + t) * BLOCK + tl.arange(0, BLOCK)
        inb = rows < n
        g = tl.load(g_ptr + rows, mask=inb, other=-1)
        m = inb & (g >= 0) & (g < num_groups)
        if HAS_VALID:
            m = m & (tl.load(valid_ptr + rows, mask=inb, other=0) != 0)
        hit = (g[:, None] == groups[None, :]) & m[:, None]
        cnt += tl.sum(hit.to(tl.int64), axis=0)
        if OP != 3:
            v = tl.load(v_ptr + rows, mask=m, other=0).to(out_ptr.dtype.element_ty)
            if OP == 0:
                acc += tl.sum(tl.where(hit, v[:, None], 0), axis=0)
            elif OP == 1:
                acc = tl.minimum(acc, tl.min(tl.where(hit, v[:, None], ident), axis=0))
            else:
                acc = tl.maximum(acc, tl.max(tl.where(hit, v[:, None], ident), axis=0))
    seen = (groups < num_groups) & (cnt > 0)
    tl.atomic_add(cnt_ptr + groups, cnt, mask=seen)
    if OP == 0:
        tl.atomic_add(out_ptr + groups, acc, mask=seen)
    elif OP == 1:
        tl.atomic_min(out_ptr + groups, acc, mask=seen)
    elif OP == 2:
        tl.atomic_max(out_ptr + groups, acc, mask=seen)


def segment_reduce_private(values, group_ids, valid, out, counts, op: str, ident, cfg) -> None:
    """As :func:`segment_reduce` for ``out.numel() <= MAX_PRIVATE_GROUPS``; ``cfg``: BLOCK (rows
    a tile) and PROGRAMS (the grid, each program taking an equal share of the tiles)."""
    n = group_ids.numel()
    if not n:
        return
    G = max(2, triton.next_power_of_2(out.numel()))
    blocks = triton.cdiv(n, cfg["BLOCK"])
    programs = min(blocks, cfg["PROGRAMS"])
    tiles = triton.cdiv(blocks, programs)
    segment_reduce_private_kernel[(triton.cdiv(blocks, tiles),)](
        values, group_ids, valid if valid is not None else group_ids, out, counts, n, out.numel(), tiles, ident,
        OP=SEGMENT_OPS[op], HAS_VALID=valid is not None, G=G, BLOCK=cfg["BLOCK"])


def segment_reduce(values, group_ids, valid, out, counts, op: str, ident, cfg) -> None:
    """Accumulate into ``out`` (``[replicas, groups]``, pre-filled with the op's identity ``ident``)
    and ``counts`` (zeros, the same shape); the caller folds the replicas."""
    n = group_ids.numel()
    if n:
        segment_reduce_kernel[_grid(n, cfg["BLOCK"])](
            values, group_ids, valid if valid is not None else group_ids, out, counts, n, out.shape[1], ident,
            out.shape[0], OP=SEGMENT_OPS[op], HAS_VALID=valid is not None, BLOCK=cfg["BLOCK"])

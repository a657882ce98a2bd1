"""Tensor-parallel GEMMs that hide their collective behind the multiply.

Shapes and names follow PyTorch's async-TP ops
(``torch.ops.symm_mem.fused_all_gather_matmul`` /
``fused_matmul_reduce_scatter``), built on plain torch.distributed
collectives (NCCL or Gloo), so they run wherever a process group does:

- ``all_gather_matmul(x_shard [M/p, *, K], w [K, N]) -> [M, *, N]``: the
  input of a column-parallel layer is sharded on rows (sequence parallel);
  the output needs every rank's rows.
- ``matmul_reduce_scatter(x [M, *, K/p], w_shard [K/p, N]) -> [M/p, *, N]``:
  a row-parallel layer's partial products, summed over ranks, each rank
  keeping its block of rows.

Pipelining. The local rows are cut into ``chunks`` row ranges; the
all-gather version multiplies its own shard while chunk 0 is gathered, then
gathers chunk j of every rank while the other ranks' rows of chunk j-1
multiply (the reduce-scatter version multiplies chunk j while chunk j-1's
partial sums travel). On CUDA the collectives are issued on a communication
stream and ordered against the compute stream by CUDA events; the gather
buffers are two chunk-sized buffers used in turn, and a reduce-scatter keeps
at most three chunk partials alive, so no buffer of the full gathered input
or of the full partial product exists beside the output. On the CPU (Gloo)
the collectives run as async work on Gloo's threads while the multiply runs
on the caller's. ``overlap=False`` runs the same chunks one after the other:
the same arithmetic, so the same numbers, for checking.

Host cost. Each chunk costs Python time to issue (its GEMM, its collective,
the events); at small shapes that exceeds the chunk's GPU time and the GPU
idles between chunks. ``graph=True`` captures the pipeline once per shape as a
CUDA graph and replays it in one launch (:func:`_replayed`).

Per-chunk multiplies: ``opforge.matmul`` on CUDA (a tile-per-program
variant while overlapping, see :data:`OVERLAP_MATMUL_VARIANT`), ``torch.matmul``
on the CPU.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass

import torch

from opforge.distributed import group as G
from opforge.distributed import symmetric
from opforge.distributed.collectives import (
    all_gather_single, check_tensor, checks_enabled, exchange, guard, reduce_scatter_single, signature,
)

WHERE_AG = "opforge.distributed.all_gather_matmul"
WHERE_RS = "opforge.distributed.matmul_reduce_scatter"
CUDA_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
# A chunk's GEMM should still fill the GPU: about 256 output tiles of 128 x 128
# (two waves on an H200's 132 SMs). More chunks hide more of the collective but
# each GEMM gets smaller and each collective pays its latency again.
MIN_CHUNK_OUTPUT = 4 * 2**20
MAX_CHUNKS = 8
# While a collective runs, NCCL's kernels hold some SMs. A persistent GEMM
# (one program per SM, each looping over its share of tiles) then has programs
# that cannot start until the collective ends, and the GEMM ends a whole share
# after the collective: no overlap. Tile-per-program kernels fill whatever SMs
# are free, so the overlapped chunks use one unless asked otherwise.
OVERLAP_MATMUL_VARIANT = "triton_tiled"
TRANSPORTS = ("auto", "nccl", "copy_engine")
DEFAULT_TRANSPORT = "nccl"

_comm_streams: dict[torch.device, torch.cuda.Stream] = {}


def default_chunks(rows: int, world: int, n: int) -> int:
    """Chunks for ``rows`` local rows (rows past dim 0 flattened) and ``n`` output columns."""
    return max(1, min(MAX_CHUNKS, rows, rows * world * n // MIN_CHUNK_OUTPUT))


def chunk_bounds(rows: int, chunks: int) -> list[tuple[int, int]]:
    """``chunks`` row ranges covering ``rows``, their lengths differing by at most one."""
    base, extra = divmod(rows, chunks)
    out, start = [], 0
    for j in range(chunks):
        stop = start + base + (1 if j < extra else 0)
        out.append((start, stop))
        start = stop
    return out


def chunk_matmul(a: torch.Tensor, b: torch.Tensor, variant: str | None = None) -> torch.Tensor:
    """One chunk's GEMM: ``opforge.matmul`` on CUDA (``variant``: forced, else
    dispatch's choice), ``torch.matmul`` elsewhere (any dtype it takes)."""
    if a.device.type != "cuda":
        return torch.matmul(a, b)
    from opforge.ops.matmul import matmul

    if variant is None:
        return matmul(a, b)
    from opforge.runtime import dispatch

    with dispatch.force_variant("matmul", variant):
        return matmul(a, b)


def resolve_variant(where: str, variant: str | None, device: torch.device) -> str | None:
    """``"auto"``: :data:`OVERLAP_MATMUL_VARIANT` on CUDA (with or without overlap, so
    ``overlap=False`` runs the same kernels), else dispatch's choice."""
    if variant == "auto":
        return OVERLAP_MATMUL_VARIANT if device.type == "cuda" else None
    if variant is None:
        return None
    from opforge.runtime import registry

    names = [v.name for v in registry.get("matmul").variants]
    if variant not in names:
        raise ValueError(f"{where}: matmul_variant must be 'auto', None or one of {names}, got {variant!r}")
    return variant


def resolve_transport(where: str, transport: str, group) -> str:
    """How rows travel between ranks: ``"nccl"`` (the group's collectives: NCCL kernels, or Gloo),
    ``"copy_engine"`` (peer copies through symmetric memory, see :mod:`opforge.distributed.symmetric`:
    no SM spent on transfers; NCCL groups on one host) or ``"auto"`` (:data:`DEFAULT_TRANSPORT`
    where it can run, else ``"nccl"``)."""
    if transport not in TRANSPORTS:
        raise ValueError(f"{where}: transport must be one of {TRANSPORTS}, got {transport!r}")
    if transport == "nccl":
        return transport
    reason = symmetric.unavailable_reason(group)
    if transport == "copy_engine" and reason:
        raise ValueError(f"{where}: transport='copy_engine' cannot run: {reason}")
    return "nccl" if reason else DEFAULT_TRANSPORT


def _comm_stream(device: torch.device) -> torch.cuda.Stream:
    if device not in _comm_streams:
        _comm_streams[device] = torch.cuda.Stream(device=device)
    return _comm_streams[device]


class _Channel:
    """Where a chunk's collective runs relative to the chunk GEMMs.

    ``cuda``: on the communication stream, each ordered by events (a gather
    waits for the GEMM that last read its buffer; a reduce-scatter waits for
    the GEMM that wrote its partial). ``async``: as Gloo async work, awaited
    before its result is needed. ``inline``: blocking, one after the other.
    """

    def __init__(self, where: str, what: str, group, device: torch.device, overlap: bool):
        self.where, self.what, self.group = where, what, group
        self.mode = ("cuda" if device.type == "cuda" else "async") if overlap else "inline"
        if self.mode == "cuda":
            self.compute = torch.cuda.current_stream(device)
            self.comm = _comm_stream(device)
            self.comm.wait_stream(self.compute)  # inputs and buffers made on the compute stream

    @property
    def overlapped(self) -> bool:
        return self.mode != "inline"

    def start(self, launch, after: torch.cuda.Event | None = None):
        """Issue ``launch(async_op)``; a handle for :meth:`wait`."""
        with guard(self.where, self.what, self.group):
            if self.mode == "cuda":
                with torch.cuda.stream(self.comm):
                    if after is not None:
                        self.comm.wait_event(after)
                    launch(False)  # NCCL orders its own stream after the current (comm) one and back
                    done = torch.cuda.Event()
                    done.record(self.comm)
                return done
            if self.mode == "async":
                return launch(True)
            launch(False)
            return None

    def wait(self, handle) -> None:
        """Make the compute side wait for a collective started by :meth:`start`."""
        if handle is None:
            return
        with guard(self.where, self.what, self.group):
            if self.mode == "cuda":
                self.compute.wait_event(handle)
            else:
                handle.wait()

    def mark(self) -> torch.cuda.Event | None:
        """An event at the compute stream's current point (None off CUDA)."""
        if self.mode != "cuda":
            return None
        ev = torch.cuda.Event()
        ev.record(self.compute)
        return ev


@dataclass
class _Graphed:
    graph: torch.cuda.CUDAGraph
    x: torch.Tensor  # the static input, refilled before each replay
    w: torch.Tensor  # held: its address is in the graph
    out: torch.Tensor  # the static output, copied out after each replay


_graphs: OrderedDict[tuple, _Graphed] = OrderedDict()
MAX_GRAPHS = 16


def release_graphs() -> None:
    """Drop the captured graphs (they hold NCCL work; :func:`opforge.distributed.destroy` calls this first)."""
    if _graphs:
        torch.cuda.synchronize()
        _graphs.clear()


G.before_destroy.append(release_graphs)


def _replayed(run, x: torch.Tensor, w: torch.Tensor, key: tuple) -> torch.Tensor:
    """``run(x)`` as a replayed CUDA graph.

    Why: the bench traced the pipeline host-bound at these sizes (2 H200s, 2026-11-30): issuing a
    chunk (its GEMM, its collective, the events) took longer in Python than the GPU took to run it,
    so the GPU idled between chunks and overlap bought nothing. A graph issues the whole pipeline
    (NCCL collectives included) in one launch. The graph is captured once per shape, dtype, ``w``
    (by address: a weight updated in place is read afresh at each replay) and options, after two
    warm-up runs on a side stream (kernels compiled, dispatch decided, NCCL communicators set up);
    each call copies ``x`` into the static input and the static output out, so callers never
    share memory with the graph. Every rank must call with the same shapes, as for the collectives."""
    full_key = key + (tuple(x.shape), x.stride(), x.dtype, x.device, w.data_ptr(), tuple(w.shape), w.stride(),
                      w.dtype)
    hit = _graphs.get(full_key)
    if hit is None:
        static_x = x.clone()
        current = torch.cuda.current_stream(x.device)
        side = torch.cuda.Stream(device=x.device)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            for _ in range(2):
                run(static_x)
        current.wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):  # NCCL's watchdog thread polls events
            out = run(static_x)
        hit = _Graphed(graph, static_x, w, out)
        _graphs[full_key] = hit
        if len(_graphs) > MAX_GRAPHS:
            _graphs.popitem(last=False)
    else:
        _graphs.move_to_end(full_key)
    hit.x.copy_(x)
    hit.graph.replay()
    return hit.out.clone()


def _check_chunks(where: str, chunks, rows: int, world: int, n: int) -> int:
    if chunks is None:
        return default_chunks(rows, world, n)
    if not isinstance(chunks, int) or isinstance(chunks, bool) or chunks < 1:
        raise ValueError(f"{where}: chunks must be a positive int or None, got {chunks!r}")
    return max(1, min(chunks, rows))


def _check_operands(where: str, x_name: str, x, w_name: str, w, group) -> None:
    check_tensor(where, x_name, x, group, min_dim=2)
    check_tensor(where, w_name, w, group, min_dim=2)
    if w.dim() != 2:
        raise ValueError(f"{where}: {w_name} must be 2-D [K, N], got shape {tuple(w.shape)}")
    if x.dtype != w.dtype:
        raise TypeError(f"{where}: {x_name} is {x.dtype} but {w_name} is {w.dtype}; they must match")
    if x.device.type == "cuda" and x.dtype not in CUDA_DTYPES:
        raise TypeError(f"{where}: on CUDA the operands must be float16, bfloat16, float32 or float64, "
                        f"got {x.dtype}")
    if x.device != w.device:
        raise ValueError(f"{where}: {x_name} is on {x.device} but {w_name} is on {w.device}")
    if x.shape[-1] != w.shape[0]:
        raise ValueError(f"{where}: {x_name} has K={x.shape[-1]} (its last dim) but {w_name} has "
                         f"K={w.shape[0]} (its first); shapes {tuple(x.shape)} and {tuple(w.shape)}")


def all_gather_matmul(x_shard: torch.Tensor, w: torch.Tensor, *, group=None, chunks: int | None = None,
                      overlap: bool = True, matmul_variant: str | None = "auto", graph: bool = False,
                      transport: str = "auto") -> torch.Tensor:
    """``all_gather(x_shard, dim 0) @ w`` without waiting for the whole gather.

    ``x_shard``: ``[M/p, *, K]``, the same shape on every rank; ``w``:
    ``[K, N]``. Returns ``[M, *, N]``: rows ``[r*M/p, (r+1)*M/p)`` come from
    rank r's shard. ``chunks``: row ranges per rank (None: by size, see
    :func:`default_chunks`); ``overlap=False``: the same chunks without overlap;
    ``matmul_variant``: the chunk GEMMs' ``opforge.matmul`` variant on CUDA
    (``"auto"``: see :data:`OVERLAP_MATMUL_VARIANT`; None: dispatch's choice);
    ``graph=True`` (CUDA, with overlap): replay the pipeline as a CUDA graph (see :func:`_replayed`);
    ``transport``: how rows travel, see :func:`resolve_transport`.
    """
    world = G.world_size(group, where=WHERE_AG)
    _check_operands(WHERE_AG, "x_shard", x_shard, "w", w, group)
    variant = resolve_variant(WHERE_AG, matmul_variant, x_shard.device)
    transport = resolve_transport(WHERE_AG, transport, group)
    if checks_enabled():
        exchange(WHERE_AG, "x_shard's shape and dtype", [], f"{list(x_shard.shape)};{signature(x_shard, w)}", group)
    run = lambda x: _all_gather_matmul(x, w, group, world, chunks, overlap, variant, transport)  # noqa: E731
    if graph and overlap and x_shard.is_cuda:
        return _replayed(run, x_shard, w, ("ag", id(group), chunks, variant, transport))
    return run(x_shard)


def _all_gather_matmul(x_shard, w, group, world: int, chunks, overlap: bool, variant, transport: str) -> torch.Tensor:
    """The chunk pipeline of :func:`all_gather_matmul`, its arguments checked.

    The local shard needs no transfer, so its GEMM runs first, under the first transfer. Then
    each piece arrives in one of two buffers while the previous piece multiplies: with NCCL a
    piece is chunk j of every rank (one all-gather; its GEMMs take the other ranks' rows, at
    most two row blocks), with the copy engines it is chunk j of one peer, pulled from the
    peer's published shard."""
    K, N = w.shape
    me = G.rank(group)
    rows = math.prod(x_shard.shape[:-1])  # local rows, dims past dim 0 flattened
    out = torch.empty((world * x_shard.shape[0],) + tuple(x_shard.shape[1:-1]) + (N,), dtype=x_shard.dtype,
                      device=x_shard.device)
    if rows == 0 or K == 0:
        return out.zero_()
    x2 = x_shard.contiguous().view(rows, K)
    out3 = out.view(world, rows, N)
    if world == 1:  # nothing to gather
        out3[0].copy_(chunk_matmul(x2, w, variant))
        return out
    bounds = chunk_bounds(rows, _check_chunks(WHERE_AG, chunks, rows, world, N))
    if transport == "copy_engine":
        h = symmetric.workspace(group, rows * K * x2.element_size())
        h.barrier(channel=0)  # every peer has read this rank's previous shard
        symmetric.view(h, me, (rows, K), x2.dtype).copy_(x2)
        h.barrier(channel=1)  # every shard is published
        shards = {q: symmetric.view(h, q, (rows, K), x2.dtype) for q in range(world) if q != me}
        pieces = [((q, q + 1), a, b) for step in range(1, world) for q in [(me + step) % world] for a, b in bounds]
        slots = 1

        def fetch(buf, ranks, a, b, async_op):
            return buf[0].copy_(shards[ranks[0]][a:b])
    else:
        others = [(r0, r1) for r0, r1 in ((0, me), (me + 1, world)) if r1 > r0]  # ranks' row blocks
        pieces = [(None, a, b) for a, b in bounds]  # chunk j of every rank
        slots = world

        def fetch(buf, ranks, a, b, async_op):
            return all_gather_single(buf.view(-1, K), x2[a:b], group=group, async_op=async_op)
    ch = _Channel(WHERE_AG, f"the {'copy' if slots == 1 else 'all-gather'} of a chunk", group, x2.device, overlap)
    longest = max(b - a for a, b in bounds)
    bufs = [torch.empty(slots * longest * K, dtype=x2.dtype, device=x2.device)
            for _ in range(2 if ch.overlapped and len(pieces) > 1 else 1)]
    freed: list[torch.cuda.Event | None] = [None] * len(bufs)

    def arrived(i):
        _, a, b = pieces[i]
        return bufs[i % len(bufs)][: slots * (b - a) * K].view(slots, b - a, K)

    def start(i):
        ranks, a, b = pieces[i]
        return ch.start(lambda async_op: fetch(arrived(i), ranks, a, b, async_op), after=freed[i % len(bufs)])

    pending = start(0)
    out3[me].copy_(chunk_matmul(x2, w, variant))
    for i, (ranks, a, b) in enumerate(pieces):
        following = start(i + 1) if ch.overlapped and i + 1 < len(pieces) else None
        ch.wait(pending)
        got = arrived(i)
        for r0, r1 in ([ranks] if slots == 1 else others):
            src = got if slots == 1 else got[r0:r1]
            y = chunk_matmul(src.view((r1 - r0) * (b - a), K), w, variant)
            out3[r0:r1, a:b].copy_(y.view(r1 - r0, b - a, N))
        freed[i % len(bufs)] = ch.mark()  # the buffer may be filled again
        if i + 1 < len(pieces):
            pending = following if ch.overlapped else start(i + 1)
    return out


def matmul_reduce_scatter(x: torch.Tensor, w_shard: torch.Tensor, reduce_op: str = "sum", *, group=None,
                          chunks: int | None = None, overlap: bool = True,
                          matmul_variant: str | None = "auto", graph: bool = False,
                          transport: str = "auto") -> torch.Tensor:
    """``reduce_scatter(x @ w_shard, dim 0)`` with the reduction of one chunk
    running under the GEMM of the next.

    ``x``: ``[M, *, K/p]`` (M divisible by the group size); ``w_shard``:
    ``[K/p, N]``. Returns ``[M/p, *, N]``: rank r's rows ``[r*M/p, (r+1)*M/p)``
    of the sum (``reduce_op="avg"``: the mean) over ranks of ``x @ w_shard``.
    ``chunks``, ``overlap``, ``matmul_variant``, ``graph``, ``transport``: as :func:`all_gather_matmul`.
    """
    world = G.world_size(group, where=WHERE_RS)
    _check_operands(WHERE_RS, "x", x, "w_shard", w_shard, group)
    variant = resolve_variant(WHERE_RS, matmul_variant, x.device)
    transport = resolve_transport(WHERE_RS, transport, group)
    if reduce_op not in ("sum", "avg"):
        raise ValueError(f"{WHERE_RS}: reduce_op must be 'sum' or 'avg', got {reduce_op!r}")
    if x.shape[0] % world:
        raise ValueError(f"{WHERE_RS}: x has {x.shape[0]} rows (dim 0), not divisible by the group size {world}")
    if checks_enabled():
        exchange(WHERE_RS, "x's shape and dtype", [], f"{list(x.shape)};{signature(x, w_shard)}", group)
    pipeline = _matmul_reduce_scatter_ce if transport == "copy_engine" else _matmul_reduce_scatter
    run = lambda a: pipeline(a, w_shard, reduce_op, group, world, chunks, overlap, variant)  # noqa: E731
    if graph and overlap and x.is_cuda:
        return _replayed(run, x, w_shard, ("rs", id(group), chunks, variant, reduce_op, transport))
    return run(x)


def _matmul_reduce_scatter(x, w_shard, reduce_op: str, group, world: int, chunks, overlap: bool,
                           variant) -> torch.Tensor:
    """The chunk pipeline of :func:`matmul_reduce_scatter`, its arguments checked."""
    Kp, N = w_shard.shape
    rows = math.prod(x.shape[:-1]) // world  # output rows of each rank, dims past dim 0 flattened
    out = torch.empty((x.shape[0] // world,) + tuple(x.shape[1:-1]) + (N,), dtype=x.dtype, device=x.device)
    if rows == 0 or Kp == 0:
        return out.zero_()  # K/p = 0 on every rank: an empty sum
    x3 = x.contiguous().view(world, rows, Kp)  # [p, rows of each destination, K/p]
    out2 = out.view(rows, N)
    bounds = chunk_bounds(rows, _check_chunks(WHERE_RS, chunks, rows, world, N))
    ch = _Channel(WHERE_RS, "the reduce-scatter of a chunk", group, x.device, overlap)
    sent: list = []  # per chunk: the handle of its reduce-scatter
    for j, (a, b) in enumerate(bounds):
        if ch.mode == "cuda" and j >= 2:
            ch.wait(sent[j - 2])  # at most three chunk partials alive
        partial = chunk_matmul(x3[:, a:b], w_shard, variant).view(world * (b - a), N)
        if ch.mode == "cuda" and not torch.cuda.is_current_stream_capturing():
            partial.record_stream(ch.comm)  # (a captured graph keeps its own memory pool)
        target = out2[a:b]
        sent.append(ch.start(
            lambda async_op, t=target, p=partial: reduce_scatter_single(t, p, group=group, async_op=async_op),
            after=ch.mark()))
    for h in sent[-2:] if ch.mode == "cuda" else sent:
        ch.wait(h)
    if reduce_op == "avg":
        out.div_(world)
    return out


def _matmul_reduce_scatter_ce(x, w_shard, reduce_op: str, group, world: int, chunks, overlap: bool,
                              variant) -> torch.Tensor:
    """:func:`matmul_reduce_scatter` over the copy engines: each chunk's partial product for rank q
    is copied into q's slot for this rank in q's symmetric workspace (the peers' rows first, this
    rank's own last), and each rank then sums its ``world`` slots in a fixed order."""
    Kp, N = w_shard.shape
    me = G.rank(group)
    rows = math.prod(x.shape[:-1]) // world
    out = torch.empty((x.shape[0] // world,) + tuple(x.shape[1:-1]) + (N,), dtype=x.dtype, device=x.device)
    if rows == 0 or Kp == 0:
        return out.zero_()
    x3 = x.contiguous().view(world, rows, Kp)
    bounds = chunk_bounds(rows, _check_chunks(WHERE_RS, chunks, rows, world, N))
    h = symmetric.workspace(group, world * rows * N * x.element_size())
    h.barrier(channel=0)  # every rank has summed its slots of the previous call
    slots = [symmetric.view(h, q, (world, rows, N), x.dtype) for q in range(world)]
    ch = _Channel(WHERE_RS, "the copy of a chunk's partial sums", group, x.device, overlap)
    sent: list = []
    for q in [(me + step) % world for step in range(1, world + 1)]:
        for a, b in bounds:
            if ch.mode == "cuda" and len(sent) >= 2:
                ch.wait(sent[-2])  # at most three chunk partials alive
            partial = chunk_matmul(x3[q, a:b], w_shard, variant)
            if q == me:
                slots[me][me, a:b].copy_(partial)
                continue
            if ch.mode == "cuda" and not torch.cuda.is_current_stream_capturing():
                partial.record_stream(ch.comm)
            sent.append(ch.start(lambda async_op, d=slots[q][me, a:b], p=partial: d.copy_(p), after=ch.mark()))
    for handle in sent[-2:]:
        ch.wait(handle)
    h.barrier(channel=1)  # every rank's partials have landed
    torch.sum(slots[me], dim=0, out=out.view(rows, N))
    if reduce_op == "avg":
        out.div_(world)
    return out

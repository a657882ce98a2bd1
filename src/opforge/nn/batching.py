"""Continuous batching over the paged KV cache: the scheduler behind
``opforge.nn.generate(model, [prompt, ...], ...)``.

Each request reserves, when admitted, the KV blocks of its whole sequence
(prompt + max_new_tokens - 1 cached tokens; the last token is never fed
back), so a running request never waits for memory and nothing is preempted;
its blocks return to the free list the step it finishes (max_new_tokens
reached, or its eos token emitted). A loop iteration:

1. Admit waiting requests, first come first served, while a decode row is
   free (at most ``max_batch``) and the pool has their blocks; prefill them
   in one forward (``opforge.attention``, causal: a ``[G, S]`` batch when
   their prompts have one length, else packed into one sequence with
   ``cu_seqlens``, the varlen layout), each prompt's K / V scattered into
   its blocks. Their first token comes from the prefill.
2. One decode step for every running row: the row's last token at its own
   position, its K / V appended at its slot, ``opforge.attention_decode``
   over the pool with the rows' block tables and lengths.
3. Rows that finished leave; the others keep their blocks and their order
   does not matter (a row is only its block table), so no KV is ever moved.

CUDA graphs: the decode step is captured once per *bucket* of batch sizes
(powers of two up to ``max_batch``, and ``max_batch``) and replayed, so
admissions and departures do not re-capture. A step of ``n`` rows runs the
smallest bucket ``b >= n``: rows ``n .. b-1`` are padding rows (token 0 at
position 0, block table all scratch block 0, never advancing) whose K / V
writes go to the scratch block (``nn/kv_blocks.py``) and whose tokens are
dropped.

The step's state lives on the device, one int64 buffer ``[rows, 3 +
max_blocks]`` (last token, position, live flag, block table); the step
derives each row's slot and length from its position and table, and ends by
storing its tokens and advancing live rows' positions. So between events the
host neither copies nor waits: it replays the graph for as many steps as no
request can finish (the fewest tokens any running row still owes), then
reads the tokens of those steps back at once (one sync). The host refills
the buffer only when rows came or went. A running request with an eos id is
checked every ``EOS_CHECK_STEPS`` steps: the tokens it made after its eos
are dropped (their K / V went to its own reserved blocks), and its blocks
free at that check.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import torch
from torch import nn

from opforge.nn.decoder import cache_geometry, next_tokens
from opforge.nn.kv_blocks import BlockAllocator, PagedKV, blocks_for, token_slots
from opforge.ops.attention import attention
from opforge.ops.attention_decode import attention_decode

WARMUP_STEPS = 2  # eager decode steps of a bucket before its CUDA graph is captured
EOS_CHECK_STEPS = 4  # decode steps between checks of running requests that have an eos id
TOKEN, POSITION, LIVE, TABLE = 0, 1, 2, 3  # columns of the step's state buffer


@dataclass
class Request:
    """One prompt's generation: its blocks, cached length and tokens so far."""

    prompt: torch.Tensor  # 1-D int64 on the model's device
    max_new: int
    eos: int | None
    blocks: list[int] = field(default_factory=list)
    length: int = 0  # tokens in the cache
    tokens: list[int] = field(default_factory=list)  # generated so far

    @property
    def cached_tokens(self) -> int:
        return self.prompt.numel() + self.max_new - 1

    @property
    def done(self) -> bool:
        return len(self.tokens) >= self.max_new or (self.eos is not None and self.tokens[-1] == self.eos)


def bucket_sizes(max_batch: int) -> list[int]:
    sizes, b = [], 1
    while b < max_batch:
        sizes.append(b)
        b *= 2
    return sizes + [max_batch]


def _prefill(model: nn.Module, caches: list[PagedKV], group: list[Request], block_size: int) -> list[int]:
    """The prompts' K / V into their blocks; the first new token of each."""
    lengths = [r.prompt.numel() for r in group]
    device = group[0].prompt.device
    slots = torch.cat([token_slots(r.blocks, n, block_size) for r, n in zip(group, lengths)]).to(device)
    if len(set(lengths)) == 1:  # one length: a dense batch
        S = lengths[0]

        def attend(i, attn, q, k, v):
            caches[i].write(slots, k.transpose(1, 2), v)
            return attention(q, k, v.transpose(1, 2), causal=True, scale=float(attn.scaling)).transpose(1, 2)

        ids = torch.stack([r.prompt for r in group])
        return next_tokens(model, ids, torch.arange(S, device=device).view(1, S), attend).tolist()
    ends = torch.tensor(lengths).cumsum(0)
    cu = torch.cat((torch.zeros(1, dtype=torch.int32), ends.to(torch.int32))).to(device)
    longest = max(lengths)

    def attend_packed(i, attn, q, k, v):  # one row of all prompts' tokens: varlen attention over (tokens, H, D)
        caches[i].write(slots, k.transpose(1, 2), v)
        out = attention(q[0].transpose(0, 1), k[0].transpose(0, 1), v[0], causal=True, scale=float(attn.scaling),
                        cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=longest, max_seqlen_k=longest)
        return out[None]

    ids = torch.cat([r.prompt for r in group])[None]
    positions = torch.cat([torch.arange(n) for n in lengths]).to(device)[None]
    return next_tokens(model, ids, positions, attend_packed, last=(ends - 1).to(device)).tolist()


class PagedDecodeStep:
    """Decode steps of up to ``max_batch`` rows over the paged cache; on CUDA
    one graph a bucket of batch sizes (see the module docstring)."""

    def __init__(self, model, caches: list[PagedKV], block_size: int, max_blocks: int, max_batch: int,
                 max_steps: int, device, use_graph: bool):
        self.model, self.caches, self.block_size = model, caches, block_size
        self.sizes = bucket_sizes(max_batch)
        width = TABLE + max_blocks
        self.state = torch.zeros((max_batch, width), dtype=torch.long, device=device)
        self.host = torch.zeros((max_batch, width), dtype=torch.long, pin_memory=device.type == "cuda")
        self.history = torch.zeros((max_steps, max_batch), dtype=torch.long, device=device)
        self.use_graph = use_graph
        self.pool = torch.cuda.graph_pool_handle() if use_graph else None
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.eager_calls: dict[int, int] = {}
        self._rows: tuple = ()

    def _eager(self, b: int) -> torch.Tensor:
        """One step of the first ``b`` rows, reading and advancing ``state`` in place."""
        state, page = self.state[:b], self.block_size
        pos, table = state[:, POSITION], state[:, TABLE:]
        slots = table.gather(1, (pos // page)[:, None])[:, 0] * page + pos % page
        seqlens, table32 = (pos + 1).to(torch.int32), table.to(torch.int32)

        def attend(i, attn, q, k, v):
            kv = self.caches[i]
            kv.write(slots, k.transpose(1, 2), v)
            return attention_decode(q.transpose(1, 2), kv.k, kv.v, seqlens, table32, scale=float(attn.scaling))

        tokens = next_tokens(self.model, state[:, TOKEN:TOKEN + 1], state[:, POSITION:POSITION + 1], attend)
        state[:, TOKEN] = tokens
        state[:, POSITION] += state[:, LIVE]
        return tokens

    def _fill(self, rows: list[Request], b: int) -> None:
        """The rows' last tokens, positions and block tables; padding rows after them."""
        host = self.host[:b]
        host.zero_()  # padding rows: token 0, position 0, not live, table of the scratch block 0
        for i, r in enumerate(rows):
            host[i, TABLE:TABLE + len(r.blocks)] = torch.tensor(r.blocks)
        n = len(rows)
        host[:n, TOKEN] = torch.tensor([r.tokens[-1] for r in rows])
        host[:n, POSITION] = torch.tensor([r.length for r in rows])
        host[:n, LIVE] = 1
        self.state[:b].copy_(host, non_blocking=True)

    def _step(self, b: int) -> torch.Tensor:
        calls = self.eager_calls.get(b, 0)
        if not self.use_graph or calls < WARMUP_STEPS:
            self.eager_calls[b] = calls + 1
            return self._eager(b)
        if b not in self.graphs:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                out = self._eager(b)
            self.graphs[b] = (graph, out)
        graph, out = self.graphs[b]
        graph.replay()
        return out

    def __call__(self, rows: list[Request], steps: int) -> list[list[int]]:
        """``steps`` decode steps of ``rows``: their tokens, ``[steps][len(rows)]``."""
        n = len(rows)
        b = next(s for s in self.sizes if s >= n)
        key = (b, *map(id, rows))
        if self._rows != key:  # rows came or went: the host's view is current (it synced at that event)
            self._rows = key
            self._fill(rows, b)
        for j in range(steps):
            self.history[j, :b].copy_(self._step(b))
        return self.history[:steps, :n].tolist()


def run(model: nn.Module, requests: list[Request], *, max_batch: int, block_size: int, num_blocks: int | None,
        use_graph: bool) -> None:
    """Generate every request to completion (their ``tokens``), at most ``max_batch`` decoding at once."""
    device = requests[0].prompt.device
    max_blocks = max(blocks_for(r.cached_tokens, block_size) for r in requests)
    if num_blocks is None:  # room for max_batch of the largest requests, and the scratch block
        num_blocks = 1 + min(max_batch, len(requests)) * max_blocks
    for i, r in enumerate(requests):
        if blocks_for(r.cached_tokens, block_size) > num_blocks - 1:
            raise ValueError(f"opforge.nn.generate: request {i} needs {blocks_for(r.cached_tokens, block_size)} "
                             f"KV blocks of {block_size} tokens but the pool has {num_blocks - 1} (num_blocks "
                             f"{num_blocks}, one is scratch)")
    kv_heads, head_dim, dtype = cache_geometry(model)
    caches = [PagedKV(num_blocks, block_size, kv_heads, head_dim, dtype, device) for _ in model.model.layers]
    allocator = BlockAllocator(num_blocks)
    max_steps = max(r.max_new for r in requests)
    step = PagedDecodeStep(model, caches, block_size, max_blocks, max_batch, max_steps, device, use_graph)
    waiting, rows = deque(requests), []

    def finish(r: Request) -> bool:
        if r.done:
            allocator.free(r.blocks)
            r.blocks = []
        return r.done

    while waiting or rows:
        admitted = []
        while (waiting and len(rows) + len(admitted) < max_batch
               and allocator.free_count >= blocks_for(waiting[0].cached_tokens, block_size)):
            r = waiting.popleft()
            r.blocks = allocator.allocate(blocks_for(r.cached_tokens, block_size))
            admitted.append(r)
        if not admitted and not rows:  # cannot happen: an idle pool holds any request (checked above)
            raise RuntimeError(f"opforge.nn.generate: no request could be admitted ({allocator.free_count} "
                               f"free KV blocks)")
        if admitted:
            for r, token in zip(admitted, _prefill(model, caches, admitted, block_size)):
                r.length = r.prompt.numel()
                r.tokens.append(token)
        rows += [r for r in admitted if not finish(r)]
        if rows:  # decode until the first request can finish (by its count, or at an eos check)
            steps = min(r.max_new - len(r.tokens) for r in rows)
            if any(r.eos is not None for r in rows):
                steps = min(steps, EOS_CHECK_STEPS)
            for tokens in step(rows, steps):
                for r, token in zip(rows, tokens):
                    if not r.done:  # tokens after a request's eos are dropped
                        r.tokens.append(token)
            for r in rows:
                r.length += steps
            rows = [r for r in rows if not finish(r)]


__all__ = ["PagedDecodeStep", "Request", "bucket_sizes", "run"]

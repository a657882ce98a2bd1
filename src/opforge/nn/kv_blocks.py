"""The paged KV cache of ``opforge.nn.generate``: per-layer block pools and the
allocator that hands their blocks to requests.

Layout (what ``opforge.attention_decode`` reads with a ``block_table``): each
layer owns a K pool and a V pool ``[num_blocks, block_size, H_kv, D]``; token
``n`` of a request lives in block ``blocks[n // block_size]`` at slot
``n % block_size``, i.e. at flat slot ``blocks[n // block_size] * block_size +
n % block_size`` of the pool seen as ``[num_blocks * block_size, H_kv, D]``.
Writes are one ``index_copy_`` by flat slot (a scatter: prefill writes a
prompt's tokens, decode one token a row), which CUDA graphs capture as is.

Block 0 is the *scratch* block, never handed out: the padding rows of a
decode batch (see ``nn/batching.py``) write their K / V there and attend to it,
so they can never touch a live request's blocks.
"""

from __future__ import annotations

import torch

SCRATCH_BLOCK = 0


class BlockAllocator:
    """A free list over blocks ``1 .. num_blocks - 1`` (block 0 is scratch).
    Blocks go back on ``free`` when their request finishes."""

    def __init__(self, num_blocks: int):
        if num_blocks < 2:
            raise ValueError(f"opforge.nn.generate: num_blocks must be >= 2 (one scratch block and one for "
                             f"tokens), got {num_blocks}")
        self.num_blocks = num_blocks
        self._free = list(range(num_blocks - 1, SCRATCH_BLOCK, -1))  # pop() hands out low blocks first
        self._used: set[int] = set()

    @property
    def free_count(self) -> int:
        return len(self._free)

    def allocate(self, n: int) -> list[int]:
        if n > len(self._free):
            raise RuntimeError(f"opforge.nn.generate: {n} KV blocks asked, {len(self._free)} free")
        blocks = [self._free.pop() for _ in range(n)]
        self._used.update(blocks)
        return blocks

    def free(self, blocks: list[int]) -> None:
        for b in blocks:
            if b not in self._used:
                raise RuntimeError(f"opforge.nn.generate: KV block {b} freed but not allocated")
            self._used.remove(b)
            self._free.append(b)


def blocks_for(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


class PagedKV:
    """One layer's K and V pools ``[num_blocks, block_size, H_kv, D]``."""

    def __init__(self, num_blocks: int, block_size: int, kv_heads: int, head_dim: int, dtype, device):
        shape = (num_blocks, block_size, kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)

    def write(self, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store tokens' keys and values (``[N, H_kv, D]`` each) at flat ``slots`` (int64 ``[N]``)."""
        H, D = self.k.shape[2:]
        self.k.view(-1, H, D).index_copy_(0, slots, k.reshape(-1, H, D))
        self.v.view(-1, H, D).index_copy_(0, slots, v.reshape(-1, H, D))


def token_slots(blocks: list[int], tokens: int, block_size: int) -> torch.Tensor:
    """Flat pool slots (int64 ``[tokens]``) of a request's first ``tokens`` tokens."""
    n = torch.arange(tokens)
    return torch.tensor(blocks)[n // block_size] * block_size + n % block_size


__all__ = ["SCRATCH_BLOCK", "BlockAllocator", "PagedKV", "blocks_for", "token_slots"]

"""Copy-engine transfers between the GPUs of one host, through torch.distributed's symmetric memory.

Why: NCCL moves data with kernels that hold SMs. Its all-gather and reduce-scatter on two H200s
scale with the SMs they get (NCCL_MAX_NCHANNELS 4: 3.9x slower than the default; 2026-11-30), so a
collective overlapped with a GEMM takes its SMs from the GEMM and the pair runs no faster than
one after the other. A symmetric buffer (``torch.distributed._symmetric_memory``, the mechanism
of PyTorch's async-TP ops) is mapped into every rank's address space; ``dst.copy_(peer_view)``
is then a peer-to-peer ``cudaMemcpyAsync`` that the copy engines run over NVLink, using no SM.
Measured there (2026-11-30): overlapped GEMMs over this transport land within 10 % of NCCL's, so
the SMs are not the only limit (BENCHMARKS.md, fifth session).

One workspace per process group, grown when a call needs more (never while a CUDA graph is
being captured) and rendezvoused by every rank together, as a collective.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from opforge.distributed import group as G

_workspaces: dict[str, tuple[torch.Tensor, object]] = {}


def group_name(group) -> str:
    return (group or dist.group.WORLD).group_name


def unavailable_reason(group=None) -> str | None:
    """Why copy-engine transfers cannot serve ``group``, or None when they can."""
    if G.backend(group) != "nccl":
        return f"the group's backend is {G.backend(group)}; copy-engine transfers need NCCL on CUDA GPUs"
    world = dist.get_world_size(group)
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    if group not in (None, dist.group.WORLD) or local != dist.get_world_size():
        return "copy-engine transfers need every rank of the default group on one host (peer memory over NVLink)"
    try:
        import torch.distributed._symmetric_memory  # noqa: F401
    except ImportError as e:
        return f"this torch has no symmetric memory ({e})"
    return None


def workspace(group, nbytes: int):
    """The group's symmetric-memory handle, its buffer at least ``nbytes`` long.

    Collective on first use and when it grows: every rank must ask for the same size."""
    from torch.distributed import _symmetric_memory as symm_mem

    name = group_name(group)
    buf, handle = _workspaces.get(name, (None, None))
    if buf is None or buf.numel() < nbytes:
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"opforge.distributed: the symmetric workspace must grow to {nbytes} bytes while a CUDA "
                               f"graph is being captured; run the call once before capturing it")
        _workspaces.pop(name, None)
        buf = symm_mem.empty(max(nbytes, 1), dtype=torch.uint8, device=torch.device("cuda",
                                                                                     torch.cuda.current_device()))
        handle = symm_mem.rendezvous(buf, name)
        _workspaces[name] = (buf, handle)
    return handle


def view(handle, rank: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """``rank``'s workspace as a ``shape`` tensor of ``dtype`` (this rank's own or a peer's, mapped)."""
    return handle.get_buffer(rank, shape, dtype)


def release() -> None:
    """Drop the workspaces (before the group goes)."""
    if _workspaces:
        torch.cuda.synchronize()
        _workspaces.clear()


G.before_destroy.append(release)

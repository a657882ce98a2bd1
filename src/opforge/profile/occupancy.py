"""Theoretical occupancy of one kernel config on one SM, the CUDA occupancy
calculator's arithmetic (no GPU needed).

Blocks per SM is the smallest of four limits:

- warps: ``max_warps // num_warps``;
- blocks: the hardware cap (32 on Hopper);
- registers: registers are allocated per warp, ``regs * 32`` rounded up to the
  allocation unit (256); ``max_regs // per_warp`` warps fit, in whole blocks;
- shared memory: the block's bytes rounded up to the 128-byte granularity, plus
  the 1 KB the driver reserves per block, into the SM's 228 KB.

High occupancy is not the goal (bandwidth saturates early); this says what the
config allows and which resource stops it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

LIMITERS = ("warps", "blocks", "registers", "shared memory")  # tie order: first wins


@dataclass(frozen=True)
class Limits:
    """Per-SM limits; the defaults are Hopper's (sm_90, H100/H200)."""

    name: str = "sm_90"
    registers_per_sm: int = 65536
    register_alloc_unit: int = 256  # registers, per warp
    max_registers_per_thread: int = 255
    max_registers_per_block: int = 65536
    shared_per_sm: int = 228 * 1024
    shared_per_block: int = 227 * 1024  # opt-in maximum for one block
    shared_reserved_per_block: int = 1024
    shared_alloc_unit: int = 128
    max_warps_per_sm: int = 64
    max_blocks_per_sm: int = 32
    max_warps_per_block: int = 32
    warp_size: int = 32

    @classmethod
    def from_device(cls, device=None) -> "Limits":
        """Limits of a CUDA device from what ``torch.cuda.get_device_properties``
        exposes; the rest (allocation units, block cap) stay Hopper's."""
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("Limits.from_device needs a CUDA device; use Limits() for Hopper defaults")
        p = torch.cuda.get_device_properties(device if device is not None else torch.cuda.current_device())
        base = cls()
        warp = getattr(p, "warp_size", 32) or 32
        kw = {"name": f"sm_{p.major}{p.minor} ({p.name})", "warp_size": warp}
        regs = getattr(p, "regs_per_multiprocessor", 0)
        if regs:
            kw["registers_per_sm"] = regs
        threads = getattr(p, "max_threads_per_multi_processor", 0)
        if threads:
            kw["max_warps_per_sm"] = threads // warp
        smem = getattr(p, "shared_memory_per_multiprocessor", 0)
        if smem:
            kw["shared_per_sm"] = smem
        optin = getattr(p, "shared_memory_per_block_optin", 0)
        if optin:
            kw["shared_per_block"] = optin
        return cls(**{**asdict(base), **kw})


@dataclass(frozen=True)
class Occupancy:
    blocks_per_sm: int
    active_warps: int
    occupancy: float  # active_warps / max_warps_per_sm
    limiter: str  # one of LIMITERS
    limits: dict = field(default_factory=dict)  # limiter -> blocks per SM it allows

    def __str__(self) -> str:
        per = ", ".join(f"{k} {v}" for k, v in self.limits.items())
        return (f"{self.blocks_per_sm} blocks/SM, {self.active_warps} warps, "
                f"{self.occupancy:.0%} occupancy (limited by {self.limiter}; blocks allowed by: {per})")

    def to_dict(self) -> dict:
        return asdict(self)


def _ceil_to(x: int, unit: int) -> int:
    return -(-x // unit) * unit


def _whole(x, what: str) -> int:
    if isinstance(x, bool) or not isinstance(x, int):
        if isinstance(x, float) and x.is_integer():
            return int(x)
        raise TypeError(f"{what} must be an integer, got {x!r}")
    return x


def theoretical_occupancy(regs_per_thread: int, smem_bytes: int, num_warps: int,
                          limits: Limits | None = None) -> Occupancy:
    """Blocks, warps and occupancy one SM can hold for a block of ``num_warps``
    warps using ``regs_per_thread`` registers and ``smem_bytes`` of shared memory."""
    lim = limits or Limits()
    regs = _whole(regs_per_thread, "regs_per_thread")
    smem = _whole(smem_bytes, "smem_bytes")
    warps = _whole(num_warps, "num_warps")
    if warps < 1 or warps > lim.max_warps_per_block:
        raise ValueError(f"num_warps must be in 1..{lim.max_warps_per_block}, got {warps}")
    if regs < 0 or regs > lim.max_registers_per_thread:
        raise ValueError(f"regs_per_thread must be in 0..{lim.max_registers_per_thread}, got {regs}")
    if smem < 0:
        raise ValueError(f"smem_bytes must be >= 0, got {smem}")
    if smem > lim.shared_per_block:
        raise ValueError(f"{smem} bytes of shared memory exceed the per-block maximum "
                         f"{lim.shared_per_block}: the kernel cannot launch")

    by_warps = lim.max_warps_per_sm // warps
    by_blocks = lim.max_blocks_per_sm
    if regs == 0:
        by_regs = by_blocks
    else:
        per_warp = _ceil_to(regs * lim.warp_size, lim.register_alloc_unit)
        if per_warp * warps > lim.max_registers_per_block:
            raise ValueError(f"{regs} registers x {warps} warps exceed the per-block register file "
                             f"{lim.max_registers_per_block}: the kernel cannot launch")
        by_regs = (lim.registers_per_sm // per_warp) // warps
    per_block = _ceil_to(smem, lim.shared_alloc_unit) + lim.shared_reserved_per_block
    by_smem = lim.shared_per_sm // per_block
    counts = {"warps": by_warps, "blocks": by_blocks, "registers": by_regs, "shared memory": by_smem}
    blocks = min(counts.values())
    limiter = next(k for k in LIMITERS if counts[k] == blocks)
    active = blocks * warps
    return Occupancy(blocks, active, active / lim.max_warps_per_sm, limiter, counts)

"""What one warp's memory instruction costs, from its thread -> address mapping.

Shared memory: 32 banks of 4 bytes; a request is served in *wavefronts*, one per
distinct 4-byte word that the busiest bank must deliver (lanes reading the same
word share it: broadcast). Accesses wider than 4 bytes are split into phases as
the hardware does: 8-byte accesses a half-warp (16 lanes) at a time, 16-byte
accesses a quarter-warp (8 lanes) at a time, so a conflict-free request takes
1, 2 or 4 wavefronts; bank conflicts are the wavefronts beyond that.

Global memory: a request touches 32-byte sectors and 128-byte lines; the counts
are what Nsight Compute calls sectors (and lines) per request.

The mapping is any callable of the lane (an ``opforge.layout`` Layout or
swizzled ComposedLayout from thread id to element offset), times the element
size, plus a base address.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Callable, Sequence

WARP = 32
BANKS = 32
BANK_BYTES = 4
SECTOR_BYTES = 32
LINE_BYTES = 128


@dataclass(frozen=True)
class SharedCost:
    wavefronts: int
    ideal: int  # wavefronts of a conflict-free request of this width

    @property
    def conflicts(self) -> int:
        return self.wavefronts - self.ideal


@dataclass(frozen=True)
class GlobalCost:
    sectors: int
    lines: int


def lane_addresses(mapping: Callable[[int], int], element_bytes: int, base: int = 0,
                   lanes: int = WARP) -> list[int]:
    """Byte addresses of lanes ``0..lanes-1`` for a thread -> element-offset mapping."""
    return [base + mapping(t) * element_bytes for t in range(lanes)]


def _phase_lanes(width: int) -> int:
    if width <= 4:
        return WARP
    if width == 8:
        return WARP // 2
    if width == 16:
        return WARP // 4
    raise ValueError(f"opforge.layout.analyze: access width must be 1, 2, 4, 8 or 16 bytes, got {width}")


def shared_cost(addresses: Sequence[int], width: int) -> SharedCost:
    """Wavefronts of one shared-memory request: per phase, the most distinct words one bank serves."""
    if len(addresses) > WARP:
        raise ValueError(f"opforge.layout.analyze: a warp has {WARP} lanes, got {len(addresses)} addresses")
    step = _phase_lanes(width)
    wavefronts = ideal = 0
    for start in range(0, len(addresses), step):
        words_by_bank: dict[int, set[int]] = {}
        for a in addresses[start:start + step]:
            if a % min(width, 16):
                raise ValueError(f"opforge.layout.analyze: a {width}-byte access at byte {a} is misaligned")
            for word in range(a // BANK_BYTES, (a + max(width, 1) - 1) // BANK_BYTES + 1):
                words_by_bank.setdefault(word % BANKS, set()).add(word)
        if words_by_bank:
            wavefronts += max(len(w) for w in words_by_bank.values())
            ideal += 1
    return SharedCost(wavefronts, ideal)


def global_cost(addresses: Sequence[int], width: int) -> GlobalCost:
    """Distinct 32-byte sectors and 128-byte lines one global-memory request touches."""
    sectors, lines = set(), set()
    for a in addresses:
        sectors.update(range(a // SECTOR_BYTES, (a + width - 1) // SECTOR_BYTES + 1))
        lines.update(range(a // LINE_BYTES, (a + width - 1) // LINE_BYTES + 1))
    return GlobalCost(len(sectors), len(lines))


@dataclass
class Access:
    """One memory instruction of a kernel as every warp of a program issues it: ``requests``
    holds, per warp-level request, the lanes' byte addresses."""

    name: str
    space: str  # "shared" or "global"
    op: str  # "ld" or "st"
    width: int  # bytes per thread
    requests: list[list[int]] = field(default_factory=list)

    def __post_init__(self):
        if self.space not in ("shared", "global") or self.op not in ("ld", "st"):
            raise ValueError(f"opforge.layout.analyze: {self.name}: space must be shared/global and op ld/st, "
                             f"got {self.space}/{self.op}")

    def summary(self) -> dict:
        n = len(self.requests)
        if self.space == "shared":
            costs = [shared_cost(r, self.width) for r in self.requests]
            return {"requests": n, "wavefronts": sum(c.wavefronts for c in costs),
                    "conflicts": sum(c.conflicts for c in costs)}
        costs = [global_cost(r, self.width) for r in self.requests]
        return {"requests": n, "sectors": sum(c.sectors for c in costs), "lines": sum(c.lines for c in costs)}


def warp_access(name: str, space: str, op: str, mapping, *, element_bytes: int, width: int | None = None,
                base: int = 0) -> Access:
    """One warp's request from a thread -> element-offset mapping (a Layout of 32 threads)."""
    return Access(name, space, op, width or element_bytes, [lane_addresses(mapping, element_bytes, base)])


def tile_access(name: str, space: str, op: str, thread_value, memory, *, element_bytes: int,
                width: int | None = None, base: int = 0) -> Access:
    """Every request of a program that moves a tile: ``thread_value`` maps ``(lane, j)`` to a
    tile coordinate (``j`` runs over the program's requests: warps x registers) and
    ``memory`` maps that coordinate to an element offset. Requests are ordered by ``j``."""
    lanes, per_lane = _thread_value_sizes(thread_value)
    requests = [[base + memory(thread_value((t, j))) * element_bytes for t in range(lanes)] for j in range(per_lane)]
    return Access(name, space, op, width or element_bytes, requests)


def _thread_value_sizes(tv) -> tuple[int, int]:
    from opforge.layout.inttuple import product

    shape = tv.shape
    if isinstance(shape, int) or len(shape) != 2:
        raise ValueError(f"opforge.layout.analyze: a thread-value layout has two modes (lane, request), got {tv}")
    return product(shape[0]), product(shape[1])


def predict(accesses: Sequence[Access]) -> dict:
    """Per-request figures of a kernel, keyed as ``benchmarks/layout_ncu.py`` compares them:
    ``shared_ld_wavefronts_per_request``, ``shared_ld_conflicts_per_request``,
    ``global_st_sectors_per_request``, ... (an instruction kind a kernel lacks is absent)."""
    total: dict[tuple[str, str], dict] = {}
    for a in accesses:
        s = a.summary()
        t = total.setdefault((a.space, a.op), {k: 0 for k in s})
        for k, v in s.items():
            t[k] += v
    out = {}
    for (space, op), t in sorted(total.items()):
        for k, v in t.items():
            if k != "requests" and t["requests"]:
                out[f"{space}_{op}_{k}_per_request"] = v / t["requests"]
        out[f"{space}_{op}_requests"] = t["requests"]
    return out


def to_json(accesses: Sequence[Access]) -> list[dict]:
    return [{k: v for k, v in asdict(a).items() if k != "requests"} | a.summary() for a in accesses]

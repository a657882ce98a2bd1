"""Nexmark event generation: ``opforge.nexmark_events``, the persons, auctions and bids of the
Nexmark benchmark made in device memory (the built-in source of ``opforge.stream.nexmark``).

Why an op: a stateless query such as Nexmark q1 runs at the speed its events are made. In torch a
batch of bids is about 25 elementwise kernels over int64 columns (five salted hashes, ids, skewed
timestamps); the Triton kernel makes them in one pass, one load and one store per output value.

Semantics. Events are numbered globally from 0. Of each ``PROPORTION`` (50) consecutive numbers
the first ``PERSON`` (1) are persons, the next ``AUCTION`` (3) auctions and the other 46 bids, so
the ``j``-th event of a kind (``j >= 0``) is global event ``n = (j // width) * 50 + lo + j % width``
(``lo, lo + width`` the kind's offsets, ``OFFSETS``). Every pseudo-random field is a 31-bit hash
(the stream's key hash, ``opforge.stream.partitioning.hash_keys``) of ``n * 8 + seed * 1_000_003 +
salt``, so any split into batches, and any order of ``j``, gives the same events. Event ``n`` is made at
``n * 1000 // events_per_second + skew`` ms and stamped up to ``skew`` ms earlier. Ids start at
``FIRST_ID``; a bid goes to the newest auction with probability ``hot_per_mille / 1000``, else to one
of the ``auctions_in_flight`` newest. The columns per kind are ``FIELDS``.

``nexmark_events(j, kind, seed, events_per_second, skew, auctions_in_flight, hot_per_mille)``
returns int64 ``[len(FIELDS[kind]) + 1, len(j)]``: the columns in ``FIELDS`` order, then the
timestamps (equal to ``date_time``, in their own row so a batch's timestamps never alias a column
a user function may change). Negative ``j`` is not an event index (not checked on the device).

Variants, in dispatch order: ``triton_fused`` (one pass) and ``reference`` (plain torch, all salts
hashed as one ``[salts, n]`` tensor in place; the oracle and the CPU fallback).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch

from opforge.kernels import nexmark as K
from opforge.ops.library import define, direct_ok
from opforge.runtime import dispatch, registry
from opforge.runtime.registry import Spec
from opforge.runtime.shapes import bucket_size

PROPORTION = 50
PERSON, AUCTION = 1, 3  # offsets < 1: person, < 4: auction, else bid
FIRST_ID = 1000
FIELDS = {
    "person": ("id", "state", "city", "date_time"),
    "auction": ("id", "seller", "category", "initial_bid", "reserve", "date_time", "expires"),
    "bid": ("auction", "bidder", "price", "date_time"),
}
OFFSETS = {"person": (0, PERSON), "auction": (PERSON, PERSON + AUCTION), "bid": (PERSON + AUCTION, PROPORTION)}
SALTS = {"person": (0, 1, 2), "auction": (0, 3, 4, 5, 6, 7), "bid": (0, 8, 9, 10, 11)}
KINDS = tuple(FIELDS)
SEED_MULT = 1_000_003
MAX_SEED = (1 << 32) - 1


# ---------------------------------------------------------------------------
# Reference semantics (plain torch)
# ---------------------------------------------------------------------------
_SALT_COLUMNS: dict = {}


def _salt_column(salts: tuple, device) -> torch.Tensor:
    """``salts`` as a ``[k, 1]`` device tensor, made once per device: a fresh
    host-to-device copy of pageable memory per batch would block the host."""
    key = (salts, str(device))
    col = _SALT_COLUMNS.get(key)
    if col is None:
        col = _SALT_COLUMNS[key] = torch.tensor(salts, dtype=torch.int64, device=device)[:, None]
    return col


def _uniforms(n: torch.Tensor, salts: tuple, seed: int) -> torch.Tensor:
    """``hash_keys(n * 8 + seed * SEED_MULT + salt)`` for several salts at once: one ``[len(salts), N]``
    tensor hashed in place (a dozen elementwise kernels for all columns, not one pass per column)."""
    x = (n * 8 + seed * SEED_MULT).unsqueeze(0) + _salt_column(salts, n.device)
    t = torch.empty_like(x)  # hash31 in place: no temporaries beyond this scratch tensor
    x.bitwise_xor_(torch.bitwise_right_shift(x, 32, out=t)).bitwise_and_(0xFFFFFFFF)
    for _ in range(2):
        x.bitwise_xor_(torch.bitwise_right_shift(x, 16, out=t)).mul_(0x45D9F3B).bitwise_and_(0xFFFFFFFF)
    return x.bitwise_xor_(torch.bitwise_right_shift(x, 16, out=t)).bitwise_and_(0x7FFFFFFF)


def _events_ref(j, kind, seed, events_per_second, skew, auctions_in_flight, hot_per_mille):
    lo, hi = OFFSETS[kind]
    width = hi - lo
    epoch = torch.div(j, width, rounding_mode="floor")
    off = j - epoch * width + lo
    n = epoch * PROPORTION + off
    u = _uniforms(n, SALTS[kind], seed)
    ts = n * 1000 // events_per_second + skew - u[0] % (skew + 1)
    last_person = FIRST_ID + epoch * PERSON  # newest person id at this event
    if kind == "person":
        cols = (last_person + off, u[1] % 50, u[2] % 1000, ts)
    elif kind == "auction":
        initial = 100 + u[1] % 10_000
        cols = (FIRST_ID + epoch * AUCTION + (off - PERSON), FIRST_ID + u[2] % (last_person - FIRST_ID + 1),
                10 + u[3] % 5, initial, initial + u[4] % 1000, ts, ts + 10_000 + u[5] % 20_000)
    else:
        last_auction = FIRST_ID + epoch * AUCTION + (AUCTION - 1)
        hot = (u[1] % 1000) < hot_per_mille
        back = u[2] % auctions_in_flight
        auction = torch.where(hot, last_auction, (last_auction - back).clamp_min_(FIRST_ID))
        cols = (auction, FIRST_ID + u[3] % (last_person - FIRST_ID + 1), 100 + u[4] % 10_000, ts)
    return torch.stack((*cols, ts))


REFERENCE = {"nexmark_events": _events_ref}


# ---------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------
WHERE = "opforge.nexmark_events"


def _check_int(arg: str, v, low: int, high: int | None = None) -> None:
    if isinstance(v, bool):
        raise TypeError(f"{WHERE}: {arg} must be an int, got a bool")
    try:
        v = operator.index(v)
    except TypeError:
        raise TypeError(f"{WHERE}: {arg} must be an int, got {type(v).__name__}") from None
    if v < low or (high is not None and v > high):
        raise ValueError(f"{WHERE}: {arg} must be in [{low}, {'inf' if high is None else high}], got {v}")


def _check_params(kind, seed, events_per_second, skew, auctions_in_flight, hot_per_mille) -> None:
    """The scalar arguments (not in dispatch's memo key: checked on every call)."""
    if kind not in FIELDS:
        raise ValueError(f"{WHERE}: kind must be one of {list(KINDS)}, got {kind!r}")
    _check_int("seed", seed, 0, MAX_SEED)
    _check_int("events_per_second", events_per_second, 1, 1 << 31)
    _check_int("skew", skew, 0, 1 << 31)
    _check_int("auctions_in_flight", auctions_in_flight, 1, 1 << 31)
    _check_int("hot_per_mille", hot_per_mille, 0, 1000)


def validate_events(j, kind, seed, events_per_second, skew, auctions_in_flight, hot_per_mille):
    if not isinstance(j, torch.Tensor):
        raise TypeError(f"{WHERE}: j must be a torch.Tensor, got {type(j).__name__}")
    if j.dtype != torch.int64:
        raise TypeError(f"{WHERE}: j must be int64 event indices, got {j.dtype}")
    if j.dim() != 1:
        raise ValueError(f"{WHERE}: j must be 1-D, got shape {tuple(j.shape)}")
    _check_params(kind, seed, events_per_second, skew, auctions_in_flight, hot_per_mille)


# ---------------------------------------------------------------------------
# Geometry and variants
# ---------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Geometry:
    """The batch's event count and kind: the tuning bucket's facts. The memo
    key holds the count's size class only, so the first call of a class
    decides for it (the runners read sizes from their arguments)."""

    events: int
    kind: str


def geometry(j, kind, *rest) -> Geometry:
    return Geometry(j.numel(), kind)


def fused_run(g: Geometry, cfg, j, kind, seed, events_per_second, skew, auctions_in_flight, hot_per_mille):
    lo, hi = OFFSETS[kind]
    out = torch.empty((len(FIELDS[kind]) + 1, j.numel()), dtype=torch.int64, device=j.device)
    K.events(j.contiguous(), out, KINDS.index(kind), lo, hi - lo, seed * SEED_MULT, events_per_second, skew,
             auctions_in_flight, hot_per_mille, cfg)
    return out


def reference_run(g: Geometry, cfg, *args):
    return _events_ref(*args)


def configs(g: Geometry):
    return K.configs()


def default_config(g: Geometry):
    return K.default_config()


def bucket(g: Geometry) -> str:
    return f"{bucket_size(g.events)}:{g.kind}"


def specs(name: str) -> list[Spec]:
    """The variants, in dispatch order."""
    return [
        Spec("triton_fused", fused_run, version=K.NEXMARK_VERSION, configs=configs, default_config=default_config,
             bucket=bucket,
             description="one pass: load j, event number, salted hashes and every field in int64 registers, "
                         "one store per output value"),
        Spec("reference", reference_run, kind="reference", devices=("cpu", "cuda"),
             description="plain torch: all salts hashed as one tensor in place, then the fields "
                         "(about 25 kernels; the oracle and the CPU fallback)"),
    ]


# ---------------------------------------------------------------------------
# Selftest inputs
# ---------------------------------------------------------------------------
def events_samples(device: torch.device) -> list[tuple]:
    """Each kind from index 0, ranges straddling the 50-event period, a shuffled set of large
    indices (event numbers past 2^32, where the hash's high half matters), no skew and one ms of
    it, one auction in flight, all or no bids hot, a large seed, an empty batch."""
    g = torch.Generator(device="cpu").manual_seed(5)
    out = []
    for kind in KINDS:
        first = torch.arange(0, 3001, dtype=torch.int64)
        far = torch.randint(0, 1 << 40, (2000,), generator=g, dtype=torch.int64)
        out.append((first.to(device), kind, 0, 10_000, 500, 100, 500))
        out.append((far.to(device), kind, 3, 1000, 0, 1, 1000))
        out.append((far.flip(0).to(device), kind, MAX_SEED, 7, 1, 7, 0))
        out.append((first[:0].to(device), kind, 0, 10_000, 500, 100, 500))
    return out


# ---------------------------------------------------------------------------
# Registration: registry entry + torch.library op
# ---------------------------------------------------------------------------
def _tensors(j, *rest):
    return (j,)


def _memo_key(j, kind, *rest):
    return (j.dtype, j.device, j.dim(), j.numel().bit_length(), kind)


def _dtype_key(*args):
    return "int64"


OPS = registry.register_family(
    ("nexmark_events",), specs, geometry=lambda name: geometry,
    reference=REFERENCE.__getitem__,
    tensors=lambda name: _tensors,
    memo_key=lambda name: _memo_key,
    dtype_key=lambda name: _dtype_key,
    validate=lambda name: validate_events,
    samples=lambda name: events_samples,
    doc=lambda name: "Nexmark persons / auctions / bids of given event indices, made on the device in one pass",
)
EVENTS = OPS["nexmark_events"]


def _define() -> None:
    def impl(j, kind, seed, events_per_second, skew, auctions_in_flight, hot_per_mille):
        return dispatch.call(EVENTS, j, kind, seed, events_per_second, skew, auctions_in_flight, hot_per_mille)

    def fake(j, kind, seed, events_per_second, skew, auctions_in_flight, hot_per_mille):
        validate_events(j, kind, seed, events_per_second, skew, auctions_in_flight, hot_per_mille)
        return j.new_empty((len(FIELDS[kind]) + 1, j.numel()))

    define("nexmark_events(Tensor j, str kind, int seed, int events_per_second, int skew, int auctions_in_flight, "
           "int hot_per_mille) -> Tensor", impl, fake)


_define()


# ---------------------------------------------------------------------------
# Public function
# ---------------------------------------------------------------------------
def nexmark_events(j: torch.Tensor, kind: str, seed: int = 0, events_per_second: int = 10_000, skew: int = 0,
                   auctions_in_flight: int = 100, hot_per_mille: int = 500) -> torch.Tensor:
    """The Nexmark events of ``kind`` ("person", "auction" or "bid") with per-kind indices ``j``, as
    int64 ``[len(FIELDS[kind]) + 1, len(j)]``: the ``FIELDS[kind]`` columns, then the timestamps."""
    _check_params(kind, seed, events_per_second, skew, auctions_in_flight, hot_per_mille)
    if direct_ok(j):
        return dispatch.call(EVENTS, j, kind, seed, events_per_second, skew, auctions_in_flight, hot_per_mille)
    validate_events(j, kind, seed, events_per_second, skew, auctions_in_flight, hot_per_mille)
    return torch.ops.opforge.nexmark_events.default(j, kind, seed, events_per_second, skew, auctions_in_flight,
                                                    hot_per_mille)


__all__ = ["nexmark_events", "FIELDS", "OFFSETS", "SALTS", "PROPORTION", "PERSON", "AUCTION", "FIRST_ID"]

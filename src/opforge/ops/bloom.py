"""Blocked Bloom filter probe: ``opforge.blocked_bloom_probe``, the runtime filter's test of
probe keys against a join's build side in one pass.

``blocked_bloom_probe(words, keys, hashes, lo, hi, valid=None)`` returns a bool tensor of
``keys``' shape: True for key i iff ``lo <= keys[i] <= hi`` (compared as int64; ``lo`` and
``hi`` are Python ints, any size, ``None`` for no bound), ``valid[i]`` (when given; False = NULL)
and each of the key's ``hashes`` bits is set in ``words``.

The filter (Putze et al.'s *blocked* Bloom filter): ``words`` is int64, ``BLOCK_WORDS = 4``
words (256 bits, one 32-byte DRAM sector) per block, a power-of-two number of blocks. A key's
hash is SplitMix64's finalizer (``mix64``) of the key as int64; its low bits pick the block
(``h & (blocks - 1)``) and its high bytes the bits: bit i at ``pos = (h >> (56 - 8 * (i % 7)))
& 0xFF`` of the block, i.e. word ``block * 4 + pos // 64``, bit ``pos % 64``
(:func:`block_positions`, shared with ``sql.planner.runtime_filters.BlockedBloomFilter``, which
sets the same bits when it builds the filter). Bit i takes byte ``7 - i % 7`` of the hash, so
``hashes`` is 1..7 (an eighth would repeat the first). A key whose bits were set is always found
(no false negatives).

Keys: int32 or int64, 1-D, any length (0 too). The Triton kernel never materializes
``keys.long()``: it reads each key once, hashes it, reads its block's sector and writes one byte
(H200, 60M keys, 3 hashes: 0.70-0.80 ms against the reference's 20 ms; bench family ``bloom``).

Variants, in dispatch order: ``triton_fused`` (the one-pass kernel) and ``reference`` (plain
torch: the range test, the mask, :func:`block_positions`, a gather of the words and ``all``:
about 20 ops on int64 temporaries; the oracle and the CPU fallback).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch

from opforge.kernels import bloom as K
from opforge.ops.library import KEY_DTYPES, check_keys, check_valid, define, direct_ok
from opforge.runtime import dispatch, registry
from opforge.runtime.registry import Spec
from opforge.runtime.shapes import bucket_size

BLOCK_WORDS = 4  # 4 x 64 bits = one 32-byte sector per block
MAX_HASHES = 7  # bit i takes byte 7 - (i % 7) of the hash: 7 distinct bytes
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1

_MASK64 = (1 << 64) - 1


def _signed(x: int) -> int:
    """A 64-bit pattern as the int64 torch stores."""
    x &= _MASK64
    return x - (1 << 64) if x >= 1 << 63 else x


_MIX1, _MIX2, _GOLDEN = _signed(0xBF58476D1CE4E5B9), _signed(0x94D049BB133111EB), _signed(0x9E3779B97F4A7C15)


# ---------------------------------------------------------------------------
# Reference semantics (plain torch)
# ---------------------------------------------------------------------------
def mix64(x: torch.Tensor) -> torch.Tensor:
    """SplitMix64's finalizer on int64 tensors (multiplication wraps; shifts made logical by masking)."""
    def shr(v, s):
        return (v >> s) & ((1 << (64 - s)) - 1)
    x = x + _GOLDEN
    x = (x ^ shr(x, 30)) * _MIX1
    x = (x ^ shr(x, 27)) * _MIX2
    return x ^ shr(x, 31)


def block_positions(keys: torch.Tensor, blocks: int, hashes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(word index, bit 0..63) of each key's ``hashes`` bits, shape (n, hashes): the block from the
    mix's low bits, 8 bits of the high half per bit position within the 256-bit block. ``keys``:
    integers (as int64 values) or int64 bit patterns."""
    h = mix64(keys.long())
    block = h & (blocks - 1)
    out_w, out_b = [], []
    for i in range(hashes):
        pos = (h >> (56 - 8 * (i % 7))) & 0xFF  # 0..255 within the block
        out_w.append(block * BLOCK_WORDS + pos // 64)
        out_b.append(pos % 64)
    return torch.stack(out_w, -1), torch.stack(out_b, -1)


BUILD_SLICE_ROWS = 1 << 20  # keys placed at once: ~150 bytes of temporaries a key at 3 hashes


def build_words(keys: torch.Tensor, blocks: int, hashes: int) -> torch.Tensor:
    """The ``blocks * BLOCK_WORDS`` int64 words of a filter holding ``keys``: the distinct
    (word, bit) pairs of the keys not yet set, summed per word (a sum of distinct powers of two is
    their OR; no atomics), ``BUILD_SLICE_ROWS`` keys at a time. Why the slices: placing a key takes
    about 150 bytes of temporaries (hashes, positions, their sort), and a runtime filter over a
    large build side (TPC-H's orders keys: 150 M at SF100) took tens of GB at once."""
    words = torch.zeros(blocks * BLOCK_WORDS, dtype=torch.int64, device=keys.device)
    for start in range(0, keys.numel(), BUILD_SLICE_ROWS):
        word, bit = block_positions(keys[start:start + BUILD_SLICE_ROWS], blocks, hashes)
        flat = torch.unique((word * 64 + bit).reshape(-1))  # each (word, bit) once
        del word, bit
        flat = flat[((words[flat // 64] >> (flat % 64)) & 1) == 0]  # not set by an earlier slice
        words.index_add_(0, flat // 64, torch.bitwise_left_shift(torch.ones_like(flat), flat % 64))
    return words


def bloom_contains(words: torch.Tensor, keys: torch.Tensor, hashes: int) -> torch.Tensor:
    """True where all of the key's bits are set in ``words`` (no range, no mask)."""
    word, bit = block_positions(keys, words.numel() // BLOCK_WORDS, hashes)
    return (torch.bitwise_right_shift(words[word], bit) & 1).bool().all(dim=-1)


def _clamp_bounds(lo, hi) -> tuple[int, int]:
    lo = INT64_MIN if lo is None else max(INT64_MIN, min(operator.index(lo), INT64_MAX))
    hi = INT64_MAX if hi is None else max(INT64_MIN, min(operator.index(hi), INT64_MAX))
    return lo, hi


def _probe_ref(words, keys, hashes, lo, hi, valid=None):
    """The range test, the mask and the Bloom test in plain torch ops on int64 keys."""
    k = keys.long()
    lo, hi = _clamp_bounds(lo, hi)
    keep = (k >= lo) & (k <= hi)
    if valid is not None:
        keep &= valid
    return keep & bloom_contains(words, k, hashes)


REFERENCE = {"blocked_bloom_probe": _probe_ref}


# ---------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------
WHERE = "opforge.blocked_bloom_probe"


def _check_bound(arg, v):
    if v is None:
        return
    if isinstance(v, bool):
        raise TypeError(f"{WHERE}: {arg} must be an int or None, got a bool")
    try:
        operator.index(v)
    except TypeError:
        raise TypeError(f"{WHERE}: {arg} must be an int or None, got {type(v).__name__}") from None


def validate_probe(words, keys, hashes, lo, hi, valid=None):
    if not isinstance(words, torch.Tensor):
        raise TypeError(f"{WHERE}: words must be a torch.Tensor, got {type(words).__name__}")
    if words.dtype != torch.int64:
        raise TypeError(f"{WHERE}: words must be int64, got {words.dtype}")
    if words.dim() != 1:
        raise ValueError(f"{WHERE}: words must be 1-D, got shape {tuple(words.shape)}")
    blocks, rest = divmod(words.numel(), BLOCK_WORDS)
    if rest or blocks == 0 or blocks & (blocks - 1):
        raise ValueError(f"{WHERE}: words must hold a power-of-two number of {BLOCK_WORDS}-word blocks, "
                         f"got {words.numel()} words")
    check_keys(WHERE, "keys", keys)
    if words.device != keys.device:
        raise ValueError(f"{WHERE}: words is on {words.device} but keys is on {keys.device}")
    if isinstance(hashes, bool) or not isinstance(hashes, int) or not 1 <= hashes <= MAX_HASHES:
        raise ValueError(f"{WHERE}: hashes must be an int in 1..{MAX_HASHES}, got {hashes!r}")
    _check_bound("lo", lo)
    _check_bound("hi", hi)
    check_valid(WHERE, "valid", valid, keys, "keys")


# ---------------------------------------------------------------------------
# Geometry and variants
# ---------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Geometry:
    """The key count, the filter's word count and the hash count: the tuning
    bucket's facts. The memo key holds the key count's size class only, so the
    first call of a class decides for it (the runners read sizes from their
    arguments)."""

    keys: int
    words: int
    hashes: int


def geometry(words, keys, hashes, *rest) -> Geometry:
    return Geometry(keys.numel(), words.numel(), hashes)


def fused_run(g: Geometry, cfg, words, keys, hashes, lo, hi, valid=None):
    lo, hi = _clamp_bounds(lo, hi)
    out = torch.empty(keys.shape, dtype=torch.bool, device=keys.device)
    v = valid.contiguous().view(torch.int8) if valid is not None else None
    K.probe(words.contiguous(), keys.contiguous(), hashes, lo, hi, v, out.view(torch.int8), cfg)
    return out


def reference_run(g: Geometry, cfg, *args):
    return _probe_ref(*args)


def configs(g: Geometry):
    return K.configs()


def default_config(g: Geometry):
    return K.default_config()


def bucket(g: Geometry) -> str:
    return f"{bucket_size(g.keys)}/{bucket_size(g.words)}:{g.hashes}"


def specs(name: str) -> list[Spec]:
    """The variants, in dispatch order."""
    return [
        Spec("triton_fused", fused_run, version=K.BLOOM_VERSION, configs=configs, default_config=default_config,
             bucket=bucket,
             description="one pass: load the key, range + NULL test, SplitMix64 in uint64, "
                         "one 32-byte block load, test the bits, write a byte"),
        Spec("reference", reference_run, kind="reference", devices=("cpu", "cuda"),
             description="plain torch: mix64 and the bit positions on int64 temporaries, gather, all "
                         "(the oracle and the CPU fallback)"),
    ]


# ---------------------------------------------------------------------------
# Selftest inputs
# ---------------------------------------------------------------------------
def probe_samples(device: torch.device) -> list[tuple]:
    """Inserted keys and misses, extreme int32/int64 keys, bounds inside and outside the key
    type's range, NULLs, 1..7 hashes, one and many blocks, an empty probe."""
    g = torch.Generator(device="cpu").manual_seed(11)
    out = []
    for dtype in KEY_DTYPES:
        info = torch.iinfo(dtype)
        for blocks, hashes in ((1, 3), (64, 1), (256, 3), (1024, 7)):
            build = torch.randint(-5000, 5000, (blocks * 20,), generator=g).to(dtype)
            words = build_words(build, blocks, hashes).to(device)
            probe = torch.cat([build[:500], torch.randint(-10000, 10000, (3000,), generator=g).to(dtype),
                               torch.tensor([info.min, info.max, -1, 0], dtype=dtype)]).to(device)
            valid = (torch.rand(probe.numel(), generator=g) > 0.1).to(device)
            out.append((words, probe, hashes, info.min, info.max))
            out.append((words, probe, hashes, -3000, 2500, valid))
            out.append((words, probe, hashes, -(1 << 40), 1 << 40, valid))
        out.append((words, probe[:0], 7, 0, 10))
    return out


# ---------------------------------------------------------------------------
# Registration: registry entry + torch.library op
# ---------------------------------------------------------------------------
def _tensors(w, k, h, lo, hi, v=None):
    return (k,) if v is None else (k, v)


def _memo_key(w, k, h, lo, hi, v=None):
    return (w.dtype, w.device, w.shape, k.dtype, k.device, k.dim(), k.numel().bit_length(), h, type(lo), type(hi),
            None if v is None else (v.dtype, v.device, v.shape == k.shape))


def _dtype_key(w, k, *rest):
    return str(k.dtype).replace("torch.", "")


OPS = registry.register_family(
    ("blocked_bloom_probe",), specs, geometry=lambda name: geometry,
    reference=REFERENCE.__getitem__,
    tensors=lambda name: _tensors,
    memo_key=lambda name: _memo_key,
    dtype_key=lambda name: _dtype_key,
    validate=lambda name: validate_probe,
    samples=lambda name: probe_samples,
    doc=lambda name: "blocked Bloom filter + [lo, hi] range + NULL test of int keys in one pass (runtime filters)",
)
PROBE = OPS["blocked_bloom_probe"]


def _define() -> None:
    def impl(words, keys, hashes, lo, hi, valid):
        return dispatch.call(PROBE, words, keys, hashes, lo, hi, valid)

    def fake(words, keys, hashes, lo, hi, valid):
        validate_probe(words, keys, hashes, lo, hi, valid)
        return keys.new_empty(keys.shape, dtype=torch.bool)

    define("blocked_bloom_probe(Tensor words, Tensor keys, int hashes, int lo, int hi, Tensor? valid) -> Tensor",
           impl, fake)


_define()


# ---------------------------------------------------------------------------
# Public function
# ---------------------------------------------------------------------------
def blocked_bloom_probe(words: torch.Tensor, keys: torch.Tensor, hashes: int, lo: int | None = None,
                        hi: int | None = None, valid: torch.Tensor | None = None) -> torch.Tensor:
    """True for each key with ``lo <= key <= hi`` (int64 comparison; None: no bound), ``valid``
    (when given) and all ``hashes`` of its bits set in the blocked Bloom filter ``words``."""
    _check_bound("lo", lo)
    _check_bound("hi", hi)
    lo, hi = _clamp_bounds(lo, hi)
    if direct_ok(keys) and type(words) is torch.Tensor and (valid is None or type(valid) is torch.Tensor):
        return dispatch.call(PROBE, words, keys, hashes, lo, hi, valid)
    validate_probe(words, keys, hashes, lo, hi, valid)
    return torch.ops.opforge.blocked_bloom_probe.default(words, keys, hashes, lo, hi, valid)


__all__ = ["blocked_bloom_probe", "block_positions", "bloom_contains", "build_words", "mix64", "BLOCK_WORDS",
           "MAX_HASHES"]

"""The blocked Bloom filter probe under the Triton interpreter: ``triton_fused`` equals the
plain-torch reference bit for bit on int32 / int64 keys (INT_MIN / INT_MAX, negatives), range
bounds at and past the keys' edges (and past int32 for int32 keys), NULL masks, empty input, 1..7
hashes and several block counts; inserted keys are always found (no false negatives). The bit
positions themselves are checked against SplitMix64 computed with Python ints (an oracle that is
not opforge), and so are the words ``BlockedBloomFilter.build`` sets.
"""

from __future__ import annotations

import pytest
import torch

import opforge
from opforge.ops import bloom as B
from opforge.runtime import dispatch
from opforge.sql.planner.runtime_filters import BlockedBloomFilter

pytestmark = [
    pytest.mark.filterwarnings("ignore::RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:Conversion of an array:DeprecationWarning"),
]

# Small blocks: many programs and a ragged last one (the interpreter runs ~5 ms a program).
CONFIGS = {"small_blocks": {"BLOCK": 128}, "large_blocks": {"BLOCK": 1024, "num_warps": 8}}
M64 = (1 << 64) - 1


# ---------------------------------------------------------------------------
# An oracle in Python ints: SplitMix64's finalizer and the documented positions
# ---------------------------------------------------------------------------
def splitmix64(key: int) -> int:
    x = (key + 0x9E3779B97F4A7C15) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def oracle_positions(key: int, blocks: int, hashes: int) -> list[tuple[int, int]]:
    h = splitmix64(key)
    block = h & (blocks - 1)
    out = []
    for i in range(hashes):
        pos = (h >> (56 - 8 * (i % 7))) & 0xFF
        out.append((block * 4 + pos // 64, pos % 64))
    return out


def oracle_words(keys: list[int], blocks: int, hashes: int) -> list[int]:
    words = [0] * (blocks * 4)
    for k in keys:
        for w, b in oracle_positions(k, blocks, hashes):
            words[w] |= 1 << b
    return [w - (1 << 64) if w >= 1 << 63 else w for w in words]


def oracle_probe(words: list[int], keys: list[int], hashes: int, lo: int, hi: int, valid=None) -> list[bool]:
    blocks = len(words) // 4
    out = []
    for i, k in enumerate(keys):
        ok = lo <= k <= hi and (valid is None or valid[i])
        ok = ok and all((words[w] >> b) & 1 for w, b in oracle_positions(k, blocks, hashes))
        out.append(bool(ok))
    return out


# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------
def run_triton(cfg, words, keys, hashes, lo, hi, valid=None):
    return B.PROBE.variant("triton_fused").run(cfg, words, keys, hashes, lo, hi, valid)


def run_reference(words, keys, hashes, lo, hi, valid=None):
    return B.PROBE.reference(words, keys, hashes, lo, hi, valid)


def probe_keys(gen, n, dtype, inserted):
    info = torch.iinfo(dtype)
    rand = torch.randint(info.min, info.max, (n,), generator=gen, dtype=torch.int64)
    small = torch.randint(-2000, 2000, (n,), generator=gen, dtype=torch.int64)
    edges = torch.tensor([info.min, info.min + 1, info.max - 1, info.max, -1, 0, 1], dtype=torch.int64)
    return torch.cat([inserted.to(torch.int64), small, rand, edges]).to(dtype)


def filter_for(gen, dtype, blocks, hashes, n_build):
    info = torch.iinfo(dtype)
    build = torch.randint(-2000, 2000, (n_build,), generator=gen, dtype=torch.int64)
    build = torch.cat([build, torch.tensor([info.min, info.max, -1])]).to(dtype)
    return build, B.build_words(build, blocks, hashes)


# ---------------------------------------------------------------------------
# Triton vs reference, bit for bit
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("blocks,hashes,cfg", [
    (1, 1, "small_blocks"), (2, 2, "small_blocks"), (64, 3, "small_blocks"), (1024, 7, "small_blocks"),
    (1, 7, "large_blocks"), (1024, 3, "large_blocks")])
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64], ids=["int32", "int64"])
def test_triton_matches_reference(blocks, hashes, cfg, dtype, gen):
    build, words = filter_for(gen, dtype, blocks, hashes, n_build=max(8, blocks * 10))
    keys = probe_keys(gen, 600, dtype, build[:100])
    info = torch.iinfo(dtype)
    valid = torch.rand(keys.numel(), generator=gen) > 0.2
    bounds = [(info.min, info.max), (-1500, 1500), (-(1 << 40), 1 << 40), (-(1 << 70), 1 << 70),
              (int(keys[3]), int(keys[3])), (5, 4), (info.max, info.max), (info.min, info.min)]
    for lo, hi in bounds:
        for v in (None, valid):
            out = run_triton(CONFIGS[cfg], words, keys, hashes, lo, hi, v)
            ref = run_reference(words, keys, hashes, lo, hi, v)
            assert out.dtype == torch.bool and out.shape == keys.shape
            assert torch.equal(out, ref), (lo, hi, v is None)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64], ids=["int32", "int64"])
def test_reference_and_triton_match_python_oracle(dtype, gen):
    build, words = filter_for(gen, dtype, 16, 3, 100)
    keys = probe_keys(gen, 150, dtype, build[:40])
    valid = torch.rand(keys.numel(), generator=gen) > 0.3
    assert words.tolist() == oracle_words(build.tolist(), 16, 3)
    for lo, hi in ((-(1 << 63), (1 << 63) - 1), (-1000, 1 << 35)):
        want = oracle_probe(words.tolist(), keys.tolist(), 3, lo, hi, valid.tolist())
        assert run_reference(words, keys, 3, lo, hi, valid).tolist() == want
        assert run_triton(CONFIGS["small_blocks"], words, keys, 3, lo, hi, valid).tolist() == want


def test_block_positions_match_python_oracle():
    keys = [-(1 << 63), (1 << 63) - 1, -(1 << 31), (1 << 31) - 1, -1, 0, 1, 123456789, -987654321]
    for blocks, hashes in ((1, 7), (8, 3), (1 << 20, 5)):
        word, bit = B.block_positions(torch.tensor(keys), blocks, hashes)
        got = [list(zip(w, b)) for w, b in zip(word.tolist(), bit.tolist())]
        assert got == [oracle_positions(k, blocks, hashes) for k in keys]


def test_blocked_bloom_filter_build_words_unchanged():
    """``BlockedBloomFilter.build`` sets the bits the documented scheme (and the op) reads."""
    keys = torch.tensor([5, -7, 1 << 40, -(1 << 63), (1 << 63) - 1, 5, 42])
    f = BlockedBloomFilter.build(keys, bits_per_key=256, hashes=3)
    blocks = f.words.numel() // 4
    assert blocks == 8
    assert f.words.tolist() == oracle_words(keys.tolist(), blocks, 3)
    f32 = BlockedBloomFilter.build(keys[:2].int(), bits_per_key=10, hashes=2)
    assert f32.words.tolist() == oracle_words([5, -7], 1, 2)


@pytest.mark.parametrize("slice_rows", [1, 3, 64])
def test_build_words_in_slices_sets_the_oracle_bits(monkeypatch, slice_rows):
    """Keys placed a slice at a time (``BUILD_SLICE_ROWS``): a bit an earlier slice set is not
    added again (a sum of powers of two is their OR only while they are distinct), so repeated keys
    across slices, keys sharing bits, and bit 63 (the sign) end as the oracle's OR."""
    monkeypatch.setattr(B, "BUILD_SLICE_ROWS", slice_rows)
    keys = torch.tensor([5, -7, 1 << 40, -(1 << 63), (1 << 63) - 1, 5, 42, -7, 5] + list(range(100, 160)))
    for blocks in (1, 2, 8):
        assert B.build_words(keys, blocks, 3).tolist() == oracle_words(keys.tolist(), blocks, 3)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64], ids=["int32", "int64"])
def test_empty_keys(dtype):
    words = B.build_words(torch.tensor([1, 2, 3]), 4, 3)
    keys = torch.empty(0, dtype=dtype)
    for valid in (None, torch.empty(0, dtype=torch.bool)):
        out = run_triton(CONFIGS["large_blocks"], words, keys, 3, 0, 10, valid)
        assert out.shape == (0,) and out.dtype == torch.bool
        assert opforge.blocked_bloom_probe(words, keys, 3, 0, 10, valid).shape == (0,)


@pytest.mark.parametrize("hashes", [1, 3, 7])
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64], ids=["int32", "int64"])
def test_no_false_negatives(hashes, dtype, gen):
    """Every inserted key is found, with the range [min, max] of the inserted keys."""
    info = torch.iinfo(dtype)
    build = torch.randint(info.min, info.max, (3000,), generator=gen, dtype=torch.int64).to(dtype)
    build[:2] = torch.tensor([info.min, info.max], dtype=dtype)
    f = BlockedBloomFilter.build(build, hashes=hashes)
    lo, hi = int(build.min()), int(build.max())
    assert bool(run_triton(CONFIGS["large_blocks"], f.words, build, hashes, lo, hi).all())
    assert bool(run_reference(f.words, build, hashes, lo, hi).all())
    # and few false positives: ~(1 - e^(-k n / m))^k, under 5 % for 10 bits a key
    others = torch.randint(info.min, info.max, (3000,), generator=gen, dtype=torch.int64).to(dtype)
    assert run_triton(CONFIGS["large_blocks"], f.words, others, hashes, info.min, info.max).double().mean() < 0.1


def test_non_contiguous_keys_and_mask(gen):
    build, words = filter_for(gen, torch.int64, 8, 3, 80)
    keys = probe_keys(gen, 200, torch.int64, build[:50]).repeat_interleave(2)[::2]
    valid = (torch.rand(2 * keys.numel(), generator=gen) > 0.2)[1::2]
    assert not keys.is_contiguous() and not valid.is_contiguous()
    out = run_triton(CONFIGS["small_blocks"], words, keys, 3, -1000, 1000, valid)
    assert torch.equal(out, run_reference(words, keys, 3, -1000, 1000, valid))


# ---------------------------------------------------------------------------
# Registry, dispatch, public API
# ---------------------------------------------------------------------------
def test_dispatch_public_api_and_torch_library(gen):
    build, words = filter_for(gen, torch.int32, 4, 3, 40)
    keys = probe_keys(gen, 100, torch.int32, build)
    d = dispatch.explain("blocked_bloom_probe", words, keys, 3, 0, 10, None)
    assert d.variant.name == "triton_fused"
    assert [v.name for v in B.PROBE.variants] == ["triton_fused", "reference"]
    want = run_reference(words, keys, 3, -(1 << 40), 1 << 40)
    assert torch.equal(opforge.blocked_bloom_probe(words, keys, 3, -(1 << 40), 1 << 40), want)
    assert torch.equal(opforge.blocked_bloom_probe(words, keys, 3), run_reference(words, keys, 3, None, None))
    assert torch.equal(torch.ops.opforge.blocked_bloom_probe(words, keys, 3, -(1 << 40), 1 << 40, None), want)
    with dispatch.force_variant("blocked_bloom_probe", "reference"):
        assert torch.equal(opforge.blocked_bloom_probe(words, keys, 3, -(1 << 40), 1 << 40), want)


def test_samples_agree_with_reference():
    """The selftest samples: the Triton variant equals the reference on each."""
    for args in B.probe_samples(torch.device("cpu"))[::3]:
        out = run_triton({"BLOCK": 2048}, *args)
        assert torch.equal(out, B.PROBE.reference(*args)), [getattr(a, "shape", a) for a in args]


def test_errors_name_op_and_argument():
    words = B.build_words(torch.arange(10), 4, 3)
    keys = torch.arange(10)
    probe = opforge.blocked_bloom_probe
    with pytest.raises(TypeError, match=r"opforge.blocked_bloom_probe: keys must be int32 or int64"):
        probe(words, keys.float(), 3, 0, 1)
    with pytest.raises(ValueError, match=r"keys must be 1-D"):
        probe(words, keys.reshape(2, 5), 3, 0, 1)
    with pytest.raises(TypeError, match=r"words must be int64"):
        probe(words.int(), keys, 3, 0, 1)
    with pytest.raises(ValueError, match=r"power-of-two number of 4-word blocks, got 12 words"):
        probe(torch.zeros(12, dtype=torch.int64), keys, 3, 0, 1)
    with pytest.raises(ValueError, match=r"power-of-two number of 4-word blocks, got 6 words"):
        probe(torch.zeros(6, dtype=torch.int64), keys, 3, 0, 1)
    with pytest.raises(ValueError, match=r"power-of-two number of 4-word blocks, got 0 words"):
        probe(torch.zeros(0, dtype=torch.int64), keys, 3, 0, 1)
    with pytest.raises(ValueError, match=r"words must be 1-D"):
        probe(words.reshape(4, 4), keys, 3, 0, 1)
    for bad in (0, 8, -1, 2.0, True):
        with pytest.raises(ValueError, match=r"hashes must be an int in 1..7"):
            probe(words, keys, bad, 0, 1)
    with pytest.raises(TypeError, match=r"valid must be a bool tensor"):
        probe(words, keys, 3, 0, 1, valid=torch.ones(10, dtype=torch.int8))
    with pytest.raises(ValueError, match=r"valid has shape \(9,\) but keys has \(10,\)"):
        probe(words, keys, 3, 0, 1, valid=torch.ones(9, dtype=torch.bool))
    with pytest.raises(TypeError, match=r"lo must be an int or None"):
        probe(words, keys, 3, 0.5, 1)
    with pytest.raises(TypeError, match=r"hi must be an int or None"):
        probe(words, keys, 3, 0, True)
    with pytest.raises(TypeError, match=r"words must be a torch.Tensor"):
        probe([1, 2, 3, 4], keys, 3, 0, 1)
    with pytest.raises(ValueError, match=r"hashes in 1..7"):
        BlockedBloomFilter.build(keys, hashes=8)

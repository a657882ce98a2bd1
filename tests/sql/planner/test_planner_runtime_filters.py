"""Runtime filters: no false negatives (the join's answer cannot change), the Bloom filter's
false-positive rate near its formula, partition pruning by min/max and IN-lists, and a star
schema whose fact table, stored as key-clustered partitions, is read >= 10x less with the filter."""
import math

import numpy as np
import pytest
import torch

from opforge.sql.planner.runtime_filters import BLOOM_BITS_PER_KEY, BLOOM_HASHES, BloomFilter, RuntimeFilter


def test_bloom_filter_has_no_false_negatives_and_few_false_positives():
    g = torch.Generator().manual_seed(0)
    keys = torch.randperm(10 ** 7, generator=g)[:20000]
    bloom = BloomFilter.build(keys)
    assert bool(bloom.might_contain(keys).all())
    others = torch.arange(10 ** 7, 10 ** 7 + 200000)
    fpr = bloom.might_contain(others).double().mean().item()
    m, n, k = bloom.bits.numel(), keys.numel(), BLOOM_HASHES
    expected = (1 - math.exp(-k * n / m)) ** k
    assert m >= BLOOM_BITS_PER_KEY * n and fpr <= 1.5 * expected + 1e-3


@pytest.mark.parametrize("build_size", [5, 800, 50000])
def test_runtime_filter_mask_keeps_every_matching_probe_row(build_size):
    rng = np.random.default_rng(build_size)
    build = torch.from_numpy(rng.integers(0, 10 ** 6, build_size))
    probe = torch.from_numpy(np.concatenate([rng.integers(0, 10 ** 6, 100000), build.numpy()[:100]]))
    valid = torch.from_numpy(rng.random(len(probe)) > 0.05)
    f = RuntimeFilter.build(build)
    keep = f.mask(probe, valid)
    truth = torch.isin(probe, build) & valid
    assert bool(keep[truth].all())  # no false negatives
    assert (f.in_list is not None) == (build_size <= 1024)
    if f.in_list is not None:
        assert torch.equal(keep, truth)  # exact
    else:
        assert keep.sum() <= truth.sum() + 0.03 * len(probe)
    assert "runtime filter" in f.describe()


def test_null_and_empty_build_sides():
    f = RuntimeFilter.build(torch.tensor([3, 4, 5]), valid=torch.tensor([False, False, False]))
    assert not f.mask(torch.tensor([3, 4])).any() and not f.keep_partitions(torch.tensor([0]), torch.tensor([9])).any()
    with pytest.raises(TypeError, match="integer join keys"):
        RuntimeFilter.build(torch.tensor([1.5]))
    with pytest.raises(ValueError, match="bits_per_key"):
        BloomFilter.build(torch.tensor([1]), bits_per_key=0)


def test_partition_pruning_by_range_and_in_list():
    part_min = torch.tensor([0, 100, 200, 300, 400])
    part_max = torch.tensor([99, 199, 299, 399, 499])
    f = RuntimeFilter.build(torch.tensor([150, 160, 420]))
    # [150, 420] meets partitions 1-4; the IN-list has keys only in 1 and 4
    assert f.keep_partitions(part_min, part_max).tolist() == [False, True, False, False, True]
    wide = RuntimeFilter.build(torch.arange(150, 5000, 3), in_list_max=10)  # Bloom: range pruning only
    assert wide.keep_partitions(part_min, part_max).tolist() == [False, True, True, True, True]


def test_star_schema_reads_ten_times_fewer_fact_rows():
    """A fact table clustered on its date key, stored as 64 partitions with min/max; a dimension
    filter keeps 2 % of the dates. The build side's runtime filter prunes partitions before any
    fact row is read; the join's answer is the same as without it."""
    rng = np.random.default_rng(9)
    days, rows, parts = 1000, 200000, 64
    fact_day = torch.from_numpy(np.sort(rng.integers(0, days, rows)))
    fact_val = torch.from_numpy(rng.integers(0, 100, rows))
    bounds = torch.linspace(0, rows, parts + 1).long()
    dim_day = torch.arange(days)
    dim_holiday = torch.from_numpy(rng.random(days) < 0.02)
    selected = dim_day[dim_holiday & (dim_day >= 600) & (dim_day < 700)]  # the dimension filter

    def join_sum(day, val):
        hit = torch.isin(day, selected)
        return int(val[hit].sum()), int(hit.sum())

    full = join_sum(fact_day, fact_val)
    f = RuntimeFilter.build(selected)
    pmin = torch.stack([fact_day[bounds[i]] for i in range(parts)])
    pmax = torch.stack([fact_day[bounds[i + 1] - 1] for i in range(parts)])
    keep = f.keep_partitions(pmin, pmax)
    read = torch.cat([torch.arange(bounds[i], bounds[i + 1]) for i in range(parts) if keep[i]])
    day, val = fact_day[read], fact_val[read]
    mask = f.mask(day)
    filtered = join_sum(day[mask], val[mask])
    assert filtered == full
    assert rows / len(read) >= 10


def _truth(probe, build, valid=None):
    hit = torch.isin(probe.long(), build.long())
    return hit if valid is None else hit & valid


@pytest.mark.parametrize("in_list_max", [1024, 4], ids=["in_list", "bloom"])
def test_int32_probe_keys_with_bounds_past_int32(in_list_max):
    """A build side whose keys reach past int32: an int32 probe column is tested without wrapping
    the bounds (an int32 tensor compared with 2**40 would wrap to 0) and keeps every match."""
    i32 = torch.iinfo(torch.int32)
    build = torch.tensor([-(1 << 40), i32.min, -5, 7, 99, i32.max, 1 << 40, 3 << 50])
    probe = torch.tensor([i32.min, i32.min + 1, -5, 0, 7, 8, 99, i32.max - 1, i32.max], dtype=torch.int32)
    valid = torch.tensor([True, True, True, True, False, True, True, True, True])
    f = RuntimeFilter.build(build, in_list_max=in_list_max)
    assert (f.in_list is not None) == (in_list_max == 1024)
    for v in (None, valid):
        keep = f.mask(probe, v)
        assert keep.dtype == torch.bool and keep.shape == probe.shape
        assert bool(keep[_truth(probe, build, v)].all())
        if f.in_list is not None:
            assert torch.equal(keep, _truth(probe, build, v))
        assert torch.equal(keep, f.mask(probe.long(), v))  # same answer as the int64 column
    # ranges wholly outside int32: nothing an int32 column holds can match
    for far in (torch.tensor([1 << 40, 1 << 41]), torch.tensor([-(1 << 41), -(1 << 40)])):
        g = RuntimeFilter.build(torch.cat([far, far + 1, far + 2]), in_list_max=in_list_max)
        assert not g.mask(probe).any() and not g.mask(probe, valid).any()


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.int16], ids=["int32", "int64", "int16"])
def test_bloom_mask_is_one_blocked_bloom_probe(dtype):
    """The Bloom path is range + NULLs + blocked Bloom bits: exactly the op's reference."""
    from opforge.ops import bloom as B

    rng = np.random.default_rng(5)
    build = torch.from_numpy(rng.integers(-3000, 3000, 2000)).to(dtype)
    probe = torch.from_numpy(np.concatenate([rng.integers(-5000, 5000, 3000), build.numpy()[:50]])).to(dtype)
    valid = torch.from_numpy(rng.random(len(probe)) > 0.1)
    f = RuntimeFilter.build(build)
    assert f.in_list is None and f.bloom is not None
    keep = f.mask(probe, valid)
    want = B.REFERENCE["blocked_bloom_probe"](f.bloom.words, probe.long(), f.bloom.hashes, f.min, f.max, valid)
    assert torch.equal(keep, want)
    assert bool(keep[_truth(probe, build, valid)].all())
    assert torch.equal(f.bloom.might_contain(probe), B.bloom_contains(f.bloom.words, probe.long(), f.bloom.hashes))


@pytest.mark.triton_kernels
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64], ids=["int32", "int64"])
def test_bloom_mask_through_the_triton_kernel(dtype):
    """Under OPFORGE_INTERPRET=1, dispatch sends the mask to the Triton kernel: same answer as the
    reference, no false negatives."""
    from opforge.ops import bloom as B
    from opforge.runtime import dispatch
    from opforge.runtime.device import interpret_mode

    rng = np.random.default_rng(6)
    build = torch.from_numpy(rng.integers(-(1 << 31), (1 << 31) - 1, 1500)).to(dtype)
    probe = torch.from_numpy(np.concatenate([rng.integers(-(1 << 31), (1 << 31) - 1, 1500),
                                             build.numpy()[:200]])).to(dtype)
    valid = torch.from_numpy(rng.random(len(probe)) > 0.1)
    f = RuntimeFilter.build(build)
    assert f.bloom is not None
    words, k = f.bloom.words, f.bloom.hashes
    ran = dispatch.explain("blocked_bloom_probe", words, probe, k, f.min, f.max, valid).variant.name
    assert ran == ("triton_fused" if interpret_mode() else "reference")
    keep = f.mask(probe, valid)
    assert torch.equal(keep, B.REFERENCE["blocked_bloom_probe"](words, probe, k, f.min, f.max, valid))
    assert bool(keep[_truth(probe, build, valid)].all())
    assert bool(f.bloom.might_contain(build).all())


def test_blocked_bloom_filter_false_positive_rate():
    from opforge.sql.planner.runtime_filters import BlockedBloomFilter

    g = torch.Generator().manual_seed(1)
    keys = torch.randperm(10 ** 7, generator=g)[:20000]
    bloom = BlockedBloomFilter.build(keys)
    assert bool(bloom.might_contain(keys).all())
    fpr = bloom.might_contain(torch.arange(10 ** 7, 10 ** 7 + 100000)).double().mean().item()
    assert fpr < 0.03  # blocked: a little above the ~1.7 % of a plain filter at 10 bits, 3 hashes

"""The default mode's fallback: a bucket with no exact entry runs the nearest
bucket's config (same op, variant, kernel version, dtype and GPU model;
comparable bucket; a config that fits these arguments), else the variant's
default ("heuristic"); ``explain`` says which (issue 23)."""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import pytest
import torch

import opforge
from opforge.runtime import autotune, cache, dispatch, nearest, registry
from opforge.runtime.cache import TuneEntry
from opforge.runtime.registry import Op, Variant


@pytest.fixture
def user_cache(tmp_path, monkeypatch):
    monkeypatch.delenv("OPFORGE_AUTOTUNE", raising=False)  # the default mode
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(autotune, "tune", lambda *a, **k: pytest.fail("tuned in the default mode"))
    dispatch.reset()
    c = cache.autotune_cache()
    assert c.entries() == [] and autotune.mode() == "cached"
    return c


# ---------------------------------------------------------------------------
# Bucket distance
# ---------------------------------------------------------------------------
def test_skeleton_and_logs():
    assert nearest.parse("16h:512x512:d128:g1:causal") == ("#h:#x#:d#:g#:causal", (4.0, 9.0, 9.0, 7.0, 0.0))
    assert nearest.parse("1x1024:cc") == ("#x#:cc", (0.0, 10.0))
    assert nearest.parse("full") == ("full", ())
    assert nearest.parse("0/4:sum") == ("#/#:sum", (-1.0, 2.0))  # zero counts as 0.5


def _key(bucket, **kw):
    base = dict(op="opforge::toy", variant="v", kernel_version="1", triton="3", torch="2", gpu="G", sm_count=8,
                dtype="float32", shape_bucket=bucket)
    return cache.TuneKey(**{**base, **kw})


def _near(query, *entries):
    return nearest.neighbours(_key(query), [("tuned", nearest.index(entries))])


def test_distance_is_the_sum_of_log2_ratios_over_comparable_buckets():
    entries = [TuneEntry(_key(b), {}, 1.0) for b in
               ("16h:512x512:d128:causal", "16h:2048x2048:d128:causal", "64h:512x512:d128:causal",
                "16h:512x512:d128:full", "16h:512:d128:causal")]
    found = _near("16h:1024x1024:d128:causal", *entries)
    # "full" and the 3-number bucket are not comparable; the rest are 2, 2 and 4 doublings away
    assert [(n.bucket, n.distance) for n in found] == [
        ("16h:2048x2048:d128:causal", 2.0), ("16h:512x512:d128:causal", 2.0), ("64h:512x512:d128:causal", 4.0)]


def test_ties_are_broken_by_environment_then_source_then_bucket_text():
    same_env_far_text = TuneEntry(_key("64"), {}, 1.0)
    other_torch = TuneEntry(_key("16", torch="9"), {}, 1.0)
    found = _near("32", other_torch, same_env_far_text)
    assert [n.bucket for n in found] == ["64", "16"]  # equally far: the entry of this torch first
    a, b = TuneEntry(_key("16"), {}, 1.0), TuneEntry(_key("64"), {}, 1.0)
    assert [n.bucket for n in _near("32", b, a)] == ["16", "64"]  # then by text, whatever the input order
    user = nearest.index([TuneEntry(_key("64"), {"mine": 1}, 1.0)])
    ship = nearest.index([TuneEntry(_key("64"), {"theirs": 1}, 1.0)])
    found = nearest.neighbours(_key("32"), [("tuned", user), ("shipped", ship)])
    assert [n.source for n in found] == ["tuned", "shipped"]


@pytest.mark.parametrize("field_name, value", [("op", "opforge::other"), ("variant", "w"), ("kernel_version", "2"),
                                               ("dtype", "bfloat16"), ("gpu", "NVIDIA H100")])
def test_entries_of_another_op_variant_version_dtype_or_gpu_are_never_neighbours(field_name, value):
    assert _near("32", TuneEntry(_key("64", **{field_name: value}), {}, 1.0)) == []
    assert len(_near("32", TuneEntry(_key("64"), {}, 1.0))) == 1


# ---------------------------------------------------------------------------
# dispatch with a toy op
# ---------------------------------------------------------------------------
def _runner(name):
    def run(cfg, x):
        return SimpleNamespace(variant=name, config=cfg, value=x * 3)

    return run


def _toy(*variants) -> Op:
    return Op(name="test_nearest_toy", reference=lambda x: x * 3, tensors=lambda x: (x,),
              memo_key=lambda x: (x.dtype, tuple(x.shape), x.device),
              dtype_key=lambda x: str(x.dtype).replace("torch.", ""), variants=list(variants))


CONFIGS = [{"tile": t} for t in (16, 32, 64, 128)]


def _v(name, **kw) -> Variant:
    kw.setdefault("kind", "vendor")
    kw.setdefault("devices", ("cpu",))
    kw.setdefault("configs", lambda x: CONFIGS)
    kw.setdefault("default_config", lambda x: {"tile": 16})
    kw.setdefault("bucket", lambda x: f"n{x.numel()}")
    return Variant(name, _runner(name), **kw)


def _entry(op, variant_name, numel, config, ms):
    x = torch.zeros(numel)
    return TuneEntry(autotune.tune_key(op, op.variant(variant_name), (x,)), config, ms)


def test_no_entry_runs_the_heuristic(user_cache):
    op = _toy(_v("first"), _v("second"), _v("reference", kind="reference"))
    x = torch.ones(100)
    d = dispatch.decide(op, (x,))
    assert (d.variant.name, d.config, d.source) == ("first", {"tile": 16}, "heuristic")
    assert str(d).splitlines()[0].endswith("[heuristic]")
    assert "passed over second: supported, later in the op's order" in str(d)


def test_nearest_bucket_config_is_used_and_explained(user_cache):
    op = _toy(_v("first"))
    user_cache.put_many([_entry(op, "first", 64, {"tile": 64}, 1.0), _entry(op, "first", 1024, {"tile": 128}, 1.0)])
    x = torch.ones(100)  # n100: 0.64 doublings from n64, 3.36 from n1024
    d = dispatch.decide(op, (x,))
    assert (d.variant.name, d.config, d.source, d.near_bucket) == ("first", {"tile": 64}, "nearest", "n64")
    assert str(d).splitlines()[0] == "opforge::test_nearest_toy: runs first (v1) config={'tile': 64} [nearest bucket n64]"
    out = dispatch.call(op, x)
    assert out.config == {"tile": 64}
    torch.testing.assert_close(out.value, x * 3)
    assert dispatch.decide(op, (torch.ones(900),)).config == {"tile": 128}


def test_off_mode_uses_exact_entries_only(user_cache, monkeypatch):
    op = _toy(_v("first"))
    user_cache.put(_entry(op, "first", 64, {"tile": 64}, 1.0))
    monkeypatch.setenv("OPFORGE_AUTOTUNE", "off")
    d = dispatch.decide(op, (torch.ones(100),))
    assert (d.config, d.source) == ({"tile": 16}, "default")


def test_a_nearest_config_that_does_not_fit_falls_to_the_next_nearest(user_cache):
    op = _toy(_v("first"))
    user_cache.put_many([_entry(op, "first", 128, {"tile": 3}, 1.0),  # nearest, not a power of two
                         _entry(op, "first", 16, {"tile": 32}, 1.0)])
    d = dispatch.decide(op, (torch.ones(100),))
    assert (d.config, d.near_bucket) == ({"tile": 32}, "n16")
    # the misfit stays in the cache: it is not wrong for its own bucket
    assert user_cache.get(_entry(op, "first", 128, {}, 0).key).config == {"tile": 3}


def test_nearest_entries_choose_the_fastest_variant_among_the_closest(user_cache):
    op = _toy(_v("first"), _v("second"), _v("third"))
    user_cache.put_many([
        _entry(op, "first", 64, {"tile": 16}, 2.0),
        _entry(op, "second", 64, {"tile": 32}, 1.0),  # as close and faster: wins
        _entry(op, "third", 1024, {"tile": 64}, 0.1),  # fastest, but farther: passed over
    ])
    d = dispatch.decide(op, (torch.ones(100),))
    assert (d.variant.name, d.config, d.source) == ("second", {"tile": 32}, "nearest")
    text = str(d)
    assert "passed over first: tuned at 2 ms on bucket n64, chosen one 1 ms on bucket n64" in text
    assert "passed over third: its nearest entry (bucket n1024" in text and "is farther" in text


def test_an_exact_entry_outranks_nearest_ones(user_cache):
    """Times of another bucket are not compared with this bucket's: the exact entry decides."""
    op = _toy(_v("first"), _v("second"))
    user_cache.put_many([_entry(op, "first", 100, {"tile": 32}, 5.0),
                         _entry(op, "second", 64, {"tile": 64}, 0.01)])
    d = dispatch.decide(op, (torch.ones(100),))
    assert (d.variant.name, d.config, d.source) == ("first", {"tile": 32}, "tuned")
    assert "passed over second: no entry for this bucket" in str(d)


def test_the_index_is_built_once_and_rebuilt_after_a_put(user_cache, monkeypatch):
    op = _toy(_v("first"))
    user_cache.put(_entry(op, "first", 64, {"tile": 64}, 1.0))
    scans = []
    real = cache.AutotuneCache.entries
    monkeypatch.setattr(cache.AutotuneCache, "entries", lambda self: scans.append(1) or real(self))
    for n in (100, 101, 102, 103):  # four new shapes (memo keys): one scan
        assert dispatch.call(op, torch.ones(n)).config == {"tile": 64}
    assert len(scans) == 1
    user_cache.put(_entry(op, "first", 128, {"tile": 128}, 1.0))
    assert dispatch.call(op, torch.ones(120)).config == {"tile": 128}
    assert len(scans) == 2


def test_an_entry_from_another_torch_version_stands_in_at_distance_zero(user_cache):
    op = _toy(_v("first"))
    e = _entry(op, "first", 100, {"tile": 64}, 1.0)
    user_cache.put(TuneEntry(dataclasses.replace(e.key, torch="1.0", triton="1.0"), e.config, e.median_ms))
    d = dispatch.decide(op, (torch.ones(100),))
    assert (d.config, d.source, d.near_bucket) == ({"tile": 64}, "nearest", "n100")


def test_a_nearest_config_that_fails_at_launch_runs_the_default_and_keeps_the_entry(user_cache):
    def run(cfg, x):
        if cfg["tile"] != 16:
            raise RuntimeError("out of resources")
        return x * 3

    op = _toy(Variant("first", run, kind="vendor", devices=("cpu",), configs=lambda x: CONFIGS,
                      default_config=lambda x: {"tile": 16}, bucket=lambda x: f"n{x.numel()}"))
    user_cache.put(_entry(op, "first", 64, {"tile": 64}, 1.0))
    x = torch.ones(100)
    with pytest.warns(RuntimeWarning, match="nearest bucket n64"):
        torch.testing.assert_close(dispatch.call(op, x), x * 3)
    d = dispatch._memo[(op.name, op.memo_key(x), None)]
    assert (d.config, d.source) == ({"tile": 16}, "heuristic")
    assert len(user_cache.entries()) == 1


# ---------------------------------------------------------------------------
# A real op under the interpreter
# ---------------------------------------------------------------------------
def test_add_runs_the_nearest_bucket_config(user_cache, gen):
    op = registry.get("add")
    flat = op.variant("triton_flat")
    small = torch.randn(1024, generator=gen)
    user_cache.put(TuneEntry(autotune.tune_key(op, flat, (small, small)), {"BLOCK": 2048, "num_warps": 8}, 0.5))
    x, y = torch.randn(3000, generator=gen), torch.randn(3000, generator=gen)
    d = opforge.explain("add", x, y)
    assert (d.variant.name, d.source, d.near_bucket) == ("triton_flat", "nearest", "1024")
    assert d.config == {"BLOCK": 2048, "num_warps": 8}
    assert "[nearest bucket 1024]" in str(d).splitlines()[0]
    torch.testing.assert_close(opforge.add(x, y), x + y)
    assert math.isclose(d.timings["triton_flat"], 0.5)


def test_shipped_h200_entries_are_not_neighbours_on_another_device(user_cache, gen):
    """The shipped tables are for the H200: on the interpreter they are of another GPU."""
    assert len(cache.shipped) > 0
    x = torch.randn(1 << 20, generator=gen)
    assert opforge.explain("add", x, x).source == "heuristic"

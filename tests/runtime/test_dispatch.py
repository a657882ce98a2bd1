"""Registry and dispatch rules, and what ``explain`` says.

The rule (``opforge.runtime.dispatch`` docstring): among the variants that
support the arguments, prefer the one with the fastest tuned entry for the
shape bucket (user cache, then shipped table); with no entries, the first
supported variant in the op's order. Decisions are memoized on the op's cheap
key. ``explain`` says what would run and why each other variant was rejected.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import opforge
from opforge.runtime import autotune, cache, dispatch, registry
from opforge.runtime import device as devmod
from opforge.runtime.cache import TuneEntry
from opforge.runtime.registry import Op, Variant

TOY = "test_dispatch_toy"  # never registered globally


def _runner(name):
    def run(cfg, x):
        return SimpleNamespace(variant=name, config=cfg, value=x * 3)

    return run


def _toy(*variants: Variant, name: str = TOY) -> Op:
    return Op(
        name=name,
        reference=lambda x: x * 3,
        tensors=lambda x: (x,),
        memo_key=lambda x: (x.dtype, tuple(x.shape), x.device),
        dtype_key=lambda x: str(x.dtype).replace("torch.", ""),
        variants=list(variants),
    )


def _v(name, **kw) -> Variant:
    kw.setdefault("kind", "vendor")
    kw.setdefault("devices", ("cpu", "cuda"))
    return Variant(name, _runner(name), **kw)


@pytest.fixture
def x(gen):
    return torch.randn(6, 4, generator=gen)


@pytest.fixture
def private_cache(tmp_path, monkeypatch):
    """The process cache, in a folder of this test's own; tuning off."""
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("OPFORGE_AUTOTUNE", "off")
    dispatch.reset()
    c = cache.autotune_cache()
    assert c.path == tmp_path / "autotune.sqlite" and c.entries() == []
    return c


# ---------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------
def test_get_by_short_and_qualified_name():
    op = registry.get("add")
    assert op is registry.get("opforge::add")
    assert op.name == "add" and op.qualname == "opforge::add"
    names = [v.name for v in op.variants]
    # dispatch order: the dense kernel first, the general one next, the oracle last
    assert names[:2] == ["triton_flat", "triton_strided"] and names[-1] == "reference"
    assert op in registry.all_ops()


@pytest.mark.parametrize("name", ["no_such_op", "opforge::no_such_op", "aten::add"])
def test_get_unknown_raises_keyerror_naming_it(name):
    with pytest.raises(KeyError) as info:
        registry.get(name)
    assert name in str(info.value)


def test_register_duplicate_name_raises_and_keeps_the_original():
    original = registry.get("add")
    dup = _toy(_v("only"), name="add")
    with pytest.raises(ValueError, match="opforge::add"):
        registry.register(dup)
    assert registry.get("add") is original


def test_register_duplicate_variant_names_raises():
    op = _toy(_v("same"), _v("same"), name="test_dispatch_dup_variants")
    with pytest.raises(ValueError, match="same"):
        registry.register(op)
    with pytest.raises(KeyError):
        registry.get("test_dispatch_dup_variants")


def test_variant_lookup_by_name():
    op = registry.get("add")
    assert op.variant("triton_strided").name == "triton_strided"
    with pytest.raises(KeyError, match="nope"):
        op.variant("nope")


# ---------------------------------------------------------------------------
# decide(): constraints and rejection reasons
# ---------------------------------------------------------------------------
def test_decide_picks_first_supported_and_records_reasons(x, private_cache):
    op = _toy(
        _v("cuda_only", devices=("cuda",)),
        _v("half_only", dtypes=frozenset({torch.float16, torch.bfloat16})),
        _v("picky", check=lambda t: "needs an even number of columns" if t.shape[1] % 2 else "rows must be > 8"),
        _v("general"),
        _v("also_general"),
        _v("reference", kind="reference"),
    )
    d = dispatch.decide(op, (x,))
    assert d.variant.name == "general"
    assert d.source == "default"
    assert set(d.rejected) == {"cuda_only", "half_only", "picky"}
    assert "cpu" in d.rejected["cuda_only"] and "cuda" in d.rejected["cuda_only"]
    assert "float32" in d.rejected["half_only"] and "float16" in d.rejected["half_only"]
    assert d.rejected["picky"] == "rows must be > 8"

    text = str(d)
    lines = text.splitlines()
    assert lines[0].startswith("opforge::test_dispatch_toy: runs general")
    for name, reason in d.rejected.items():
        assert f"rejected {name}: {reason}" in text
    assert any("also_general" in ln and "rejected" not in ln for ln in lines)
    assert any("reference" in ln and "rejected" not in ln for ln in lines)
    assert len(lines) == 1 + len(op.variants) - 1  # one line per other variant

    # the chosen variant runs
    out = dispatch.call(op, x)
    assert out.variant == "general"
    torch.testing.assert_close(out.value, x * 3)


def test_dtype_constraint_accepts_listed_dtypes(gen):
    op = _toy(_v("half_only", dtypes=frozenset({torch.float16})), _v("general"))
    h = torch.randn(3, 5, generator=gen).half()
    assert dispatch.decide(op, (h,)).variant.name == "half_only"
    assert dispatch.decide(op, (h.float(),)).variant.name == "general"


def test_check_sees_the_arguments(gen):
    op = _toy(_v("wide_only", check=lambda t: None if t.shape[-1] >= 8 else f"{t.shape[-1]} columns < 8"),
              _v("general"))
    wide = dispatch.decide(op, (torch.randn(2, 8, generator=gen),))
    narrow = dispatch.decide(op, (torch.randn(2, 3, generator=gen),))
    assert wide.variant.name == "wide_only" and wide.rejected == {}
    assert narrow.variant.name == "general" and narrow.rejected == {"wide_only": "3 columns < 8"}


def test_min_capability_is_checked_on_cuda_only(monkeypatch, x):
    """A variant for sm_90 is rejected on an sm_80 GPU (faked here) with the
    capability in the reason; on the CPU there is no capability to check."""
    fake_gpu = devmod.DeviceInfo("cuda", 0, "Fake A100", 108, (8, 0), 1 << 34, 1 << 25)
    monkeypatch.setattr(devmod, "device_info", lambda device=None: fake_gpu)
    gpu_tensor = SimpleNamespace(device=torch.device("cuda", 0), dtype=torch.float32, shape=(4, 4))
    op = _toy(_v("hopper", min_capability=(9, 0)), _v("ampere", min_capability=(8, 0)))
    d = dispatch.decide(op, (gpu_tensor,), tune=False)
    assert d.variant.name == "ampere"
    assert "sm_90" in d.rejected["hopper"] and "sm_80" in d.rejected["hopper"]
    assert d.cuda_index == 0

    # CPU tensors: the capability constraint does not apply
    monkeypatch.undo()
    assert dispatch.decide(op, (x,), tune=False).variant.name == "hopper"


def test_interpreter_runs_triton_kinds_on_cpu_whatever_their_devices(x, monkeypatch):
    """Under OPFORGE_INTERPRET=1 a Triton variant (even one for sm_90, as
    DESIGN.md says: Hopper paths too) runs on CPU tensors; without it, it is
    rejected because the tensors are on the CPU."""
    op = _toy(_v("hopper_kernel", kind="triton", devices=("cuda",), min_capability=(9, 0)),
              _v("reference", kind="reference"))
    assert dispatch.decide(op, (x,), tune=False).variant.name == "hopper_kernel"
    monkeypatch.setenv("OPFORGE_INTERPRET", "0")
    d = dispatch.decide(op, (x,), tune=False)
    assert d.variant.name == "reference" and d.source == "reference"
    assert "CPU" in d.rejected["hopper_kernel"]


def test_no_supported_variant_raises(x):
    op = _toy(_v("cuda_only", devices=("cuda",)))
    with pytest.raises(RuntimeError, match="cuda_only"):
        dispatch.decide(op, (x,))


def test_validate_errors_propagate(x):
    def validate(t):
        raise ValueError("opforge.test_dispatch_toy: x must be 1-D")

    op = _toy(_v("general"))
    op.validate = validate
    with pytest.raises(ValueError, match="must be 1-D"):
        dispatch.decide(op, (x,))


# ---------------------------------------------------------------------------
# Tuned entries decide between variants
# ---------------------------------------------------------------------------
def _tuned_toy():
    return _toy(
        _v("first", default_config=lambda t: {"tile": 16}, bucket=lambda t: str(t.numel())),
        _v("second", default_config=lambda t: {"tile": 32}, bucket=lambda t: str(t.numel())),
        _v("reference", kind="reference"),
    )


def test_fastest_tuned_variant_wins(x, private_cache):
    op = _tuned_toy()
    first, second = op.variant("first"), op.variant("second")
    private_cache.put_many([
        TuneEntry(autotune.tune_key(op, first, (x,)), {"tile": 64}, 2.0),
        TuneEntry(autotune.tune_key(op, second, (x,)), {"tile": 128, "split": 3}, 0.5),
    ])
    d = dispatch.decide(op, (x,))
    assert d.variant.name == "second"
    assert d.source == "tuned"
    assert d.config == {"tile": 128, "split": 3}
    assert d.timings == {"first": 2.0, "second": 0.5}
    assert "passed over first: tuned at 2 ms" in str(d)

    out = dispatch.call(op, x)
    assert out.variant == "second" and out.config == {"tile": 128, "split": 3}
    torch.testing.assert_close(out.value, x * 3)


@pytest.mark.parametrize("second_ms, winner", [(0.99, "first"), (0.96, "second")])
def test_a_tie_within_the_margin_goes_to_the_earlier_variant(x, private_cache, second_ms, winner):
    """Noise must not flip decisions: 1 % faster is a tie (first in order wins), 4 % is not."""
    assert 0.01 < dispatch.TIE_MARGIN < 0.04
    op = _tuned_toy()
    private_cache.put_many([
        TuneEntry(autotune.tune_key(op, op.variant("first"), (x,)), {"tile": 64}, 1.0),
        TuneEntry(autotune.tune_key(op, op.variant("second"), (x,)), {"tile": 128}, second_ms),
    ])
    assert dispatch.decide(op, (x,)).variant.name == winner


def test_tuned_entry_of_another_bucket_is_not_used(gen, private_cache):
    op = _tuned_toy()
    small, big = torch.randn(4, generator=gen), torch.randn(40, generator=gen)
    private_cache.put(TuneEntry(autotune.tune_key(op, op.variant("second"), (small,)), {"tile": 8}, 0.1))
    assert dispatch.decide(op, (small,)).variant.name == "second"
    d = dispatch.decide(op, (big,))
    assert (d.variant.name, d.source, d.config) == ("first", "default", {"tile": 16})


def test_entry_of_a_rejected_variant_is_ignored(x, private_cache):
    op = _toy(
        _v("half_only", dtypes=frozenset({torch.float16}), bucket=lambda t: "all"),
        _v("general", default_config=lambda t: {"tile": 4}, bucket=lambda t: "all"),
    )
    half = x.half()
    private_cache.put(TuneEntry(autotune.tune_key(op, op.variant("half_only"), (x,)), {"tile": 1}, 0.001))
    private_cache.put(TuneEntry(autotune.tune_key(op, op.variant("half_only"), (half,)), {"tile": 2}, 0.001))
    d = dispatch.decide(op, (x,))
    assert (d.variant.name, d.source, d.config) == ("general", "default", {"tile": 4})
    assert "half_only" in d.rejected


def test_no_entries_and_tuning_off_uses_first_default(x, private_cache):
    op = _tuned_toy()
    d = dispatch.decide(op, (x,))
    assert d.variant.name == "first"
    assert d.source == "default"
    assert d.config == {"tile": 16}
    assert d.timings == {}
    assert private_cache.entries() == []  # off: nothing was tuned
    out = dispatch.call(op, x)
    assert out.variant == "first" and out.config == {"tile": 16}


def test_tuning_on_tunes_the_preferred_variant_once(x, private_cache, monkeypatch):
    monkeypatch.setenv("OPFORGE_AUTOTUNE", "on")
    runs = []

    def run(cfg, t):
        runs.append(cfg["tile"])
        return t * 3

    configs = [{"tile": 1}, {"tile": 2}]
    op = _toy(
        Variant("first", run, kind="vendor", devices=("cpu",), configs=lambda t: configs,
                default_config=lambda t: {"tile": 1}),
        _v("second"),
    )
    d = dispatch.decide(op, (x,))
    assert d.variant.name == "first" and d.source == "tuned"
    assert d.config in configs
    assert set(runs) == {1, 2}  # both candidates were measured
    stored = private_cache.entries()
    assert [e.key.variant for e in stored] == ["first"]  # "on" tunes the preferred variant only
    assert stored[0].config == d.config

    runs.clear()
    d2 = dispatch.decide(op, (x,))  # now cached: no measuring
    assert runs == [] and d2.source == "tuned" and d2.config == d.config


def test_explain_never_tunes(x, private_cache, monkeypatch):
    monkeypatch.setenv("OPFORGE_AUTOTUNE", "exhaustive")
    monkeypatch.setattr(autotune, "tune", lambda *a, **k: pytest.fail("explain tuned"))
    d = opforge.explain("add", x, x + 1)
    assert d.variant.name == "triton_flat" and d.source == "default"


# ---------------------------------------------------------------------------
# force_variant
# ---------------------------------------------------------------------------
def test_force_variant_forces_and_restores(gen):
    x, y = torch.randn(8, 5, generator=gen), torch.randn(8, 5, generator=gen)
    assert opforge.explain("add", x, y).variant.name == "triton_flat"
    with dispatch.force_variant("add", "triton_strided"):
        d = opforge.explain("add", x, y)
        assert d.variant.name == "triton_strided" and d.source == "forced"
        torch.testing.assert_close(opforge.add(x, y), x + y)
        with dispatch.force_variant("opforge::add", "reference"):
            assert opforge.explain("add", x, y).variant.name == "reference"
        assert opforge.explain("add", x, y).variant.name == "triton_strided"  # inner restored the outer
        assert opforge.explain("mul", x, y).variant.name == "triton_flat"  # other ops untouched
    d = opforge.explain("add", x, y)
    assert d.variant.name == "triton_flat" and d.source != "forced"


def test_force_variant_restores_after_an_exception(gen):
    x = torch.randn(16, generator=gen)
    with pytest.raises(ZeroDivisionError):
        with dispatch.force_variant("add", "reference"):
            1 / 0
    assert opforge.explain("add", x, x).variant.name == "triton_flat"


def test_forcing_a_variant_that_rejects_the_args_raises(gen):
    x, y = torch.randn(8, 5, generator=gen), torch.randn(5, generator=gen)  # broadcast: flat rejects
    with dispatch.force_variant("add", "triton_flat"):
        with pytest.raises(ValueError, match="triton_flat"):
            opforge.explain("add", x, y)
        with pytest.raises(ValueError, match="triton_flat"):
            dispatch.call(registry.get("add"), x, y)
    torch.testing.assert_close(opforge.add(x, y), x + y)


def test_forcing_an_unknown_variant_raises_keyerror():
    with pytest.raises(KeyError, match="triton_nope"):
        with dispatch.force_variant("add", "triton_nope"):
            pass
    assert opforge.explain("add", torch.ones(3), torch.ones(3)).source != "forced"


# ---------------------------------------------------------------------------
# Memoization
# ---------------------------------------------------------------------------
@pytest.fixture
def count_decide(monkeypatch):
    calls = []
    real = dispatch.decide

    def counting(op, args, **kw):
        calls.append((op.name, tuple(getattr(a, "shape", None) for a in args)))
        return real(op, args, **kw)

    monkeypatch.setattr(dispatch, "decide", counting)
    return calls


def test_call_decides_once_per_memo_key(gen, count_decide):
    op = registry.get("add")
    a, b = torch.randn(4, 8, generator=gen), torch.randn(4, 8, generator=gen)
    torch.testing.assert_close(dispatch.call(op, a, b), a + b)
    c, d = torch.randn(4, 8, generator=gen), torch.randn(4, 8, generator=gen)  # new values, same shapes
    torch.testing.assert_close(dispatch.call(op, c, d), c + d)
    assert len(count_decide) == 1

    # a different shape, or the same shape with other strides, decides again
    e = torch.randn(3, 8, generator=gen)
    torch.testing.assert_close(dispatch.call(op, e, e), e + e)
    assert len(count_decide) == 2
    at, bt = a.t(), b.t()  # shape (8, 4) non-contiguous
    torch.testing.assert_close(dispatch.call(op, at, bt), at + bt)
    assert len(count_decide) == 3
    ct = c.t()
    torch.testing.assert_close(dispatch.call(op, ct, d.t()), ct + d.t())
    assert len(count_decide) == 3

    # the public API goes through the same memo
    torch.testing.assert_close(opforge.add(a, b), a + b)
    assert len(count_decide) == 3

    dispatch.reset()
    dispatch.call(op, a, b)
    assert len(count_decide) == 4


def test_forced_calls_are_memoized_apart_from_free_ones(gen, count_decide):
    """A forced variant is remembered under its own key: pinning a variant in
    production stays on the fast path, and leaving the block restores the free choice."""
    op = registry.get("add")
    a = torch.randn(10, generator=gen)
    with dispatch.force_variant("add", "reference"):
        assert dispatch.call(op, a, a) is not None
        dispatch.call(op, a, a)
    assert len(count_decide) == 1
    dispatch.call(op, a, a)
    dispatch.call(op, a, a)
    assert len(count_decide) == 2
    with dispatch.force_variant("add", "triton_strided"):
        dispatch.call(op, a, a)
    assert len(count_decide) == 3
    assert dispatch.decide(op, (a, a), tune=False).variant.name == "triton_flat"


# ---------------------------------------------------------------------------
# explain
# ---------------------------------------------------------------------------
def test_explain_contiguous_pair_runs_triton_flat(gen):
    x, y = torch.randn(8, 5, generator=gen), torch.randn(8, 5, generator=gen)
    d = opforge.explain("add", x, y)
    assert d.variant.name == "triton_flat"
    assert "triton_strided" not in d.rejected and "reference" not in d.rejected
    text = str(d)
    assert text.splitlines()[0].startswith("opforge::add: runs triton_flat")
    assert "rejected triton_strided" not in text
    for name, reason in d.rejected.items():  # whatever else is rejected says why
        assert f"rejected {name}: {reason}" in text
    torch.testing.assert_close(opforge.add(x, y), x + y)


def test_explain_broadcast_pair_runs_triton_strided(gen):
    x, y = torch.randn(8, 5, generator=gen), torch.randn(5, generator=gen)
    d = opforge.explain("opforge::add", x, y)
    assert d.variant.name == "triton_strided"
    assert "triton_flat" in d.rejected and "reference" not in d.rejected
    text = str(d)
    assert "runs triton_strided" in text
    assert f"rejected triton_flat: {d.rejected['triton_flat']}" in text
    assert "dense" in d.rejected["triton_flat"]
    torch.testing.assert_close(opforge.add(x, y), x + y)


def test_explain_without_interpreter_runs_reference_on_cpu(gen, monkeypatch):
    monkeypatch.setenv("OPFORGE_INTERPRET", "0")
    dispatch.reset()
    x, y = torch.randn(8, 5, generator=gen), torch.randn(8, 5, generator=gen)
    d = opforge.explain("add", x, y)
    assert d.variant.name == "reference"
    assert d.source == "reference"
    assert {"triton_flat", "triton_strided"} <= set(d.rejected) and "reference" not in d.rejected
    for name in ("triton_flat", "triton_strided"):
        assert "CPU" in d.rejected[name]
        assert f"rejected {name}: {d.rejected[name]}" in str(d)
    torch.testing.assert_close(opforge.add(x, y), x + y)
    monkeypatch.undo()
    dispatch.reset()
    assert opforge.explain("add", x, y).variant.name == "triton_flat"

"""``OPFORGE_AUTOTUNE=background``: a new bucket runs at once with what the
tables suggest, a daemon thread tunes it on clones of the arguments, and the
next call runs the tuned config (issue 23)."""

from __future__ import annotations

import threading
import time

import pytest
import torch

import opforge
from opforge.runtime import autotune, background, cache, dispatch, registry
from opforge.runtime.registry import Op, Variant


@pytest.fixture
def background_mode(tmp_path, monkeypatch):
    monkeypatch.setenv("OPFORGE_AUTOTUNE", "background")
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(tmp_path))
    dispatch.reset()
    background.skipped.clear()
    yield cache.autotune_cache()
    assert background.drain(timeout=120)


def _toy(run, configs) -> Op:
    return Op(name="test_background_toy", reference=lambda x: x * 3, tensors=lambda x: (x,),
              memo_key=lambda x: (x.dtype, tuple(x.shape), tuple(x.stride()), x.device),
              dtype_key=lambda x: str(x.dtype).replace("torch.", ""),
              variants=[Variant("only", run, kind="vendor", devices=("cpu",), configs=lambda x: configs,
                                default_config=lambda x: configs[0], bucket=lambda x: str(x.numel())),
                        Variant("reference", lambda cfg, x: x * 3, kind="reference", devices=("cpu",))])


def test_the_call_runs_at_once_and_the_next_call_runs_the_tuned_config(background_mode):
    seen = []  # (thread, config, the tensor's data pointer, strides)

    def run(cfg, x):
        seen.append((threading.current_thread(), cfg["tile"], x.data_ptr(), x.stride()))
        if cfg["tile"] == 1:
            time.sleep(0.004)  # the default config is the slow one
        return x * 3

    op = _toy(run, [{"tile": 1}, {"tile": 2}])
    x = torch.arange(24.0).reshape(4, 6).t()  # non-contiguous: the clone keeps the strides
    caller = threading.current_thread()

    out = dispatch.call(op, x)
    torch.testing.assert_close(out, x * 3)
    mine = [s for s in seen if s[0] is caller]
    assert [(s[1], s[2], s[3]) for s in mine] == [(1, x.data_ptr(), x.stride())]  # ran once, the heuristic

    assert background.drain(timeout=60)
    tuned = [s for s in seen if s[0] is not caller]
    assert {s[1] for s in tuned} == {1, 2}  # the worker measured both candidates ...
    assert all(s[2] != x.data_ptr() and s[3] == x.stride() for s in tuned)  # ... on a clone, strides kept
    stored = background_mode.entries()
    assert [(e.key.variant, e.config) for e in stored] == [("only", {"tile": 2})]

    seen.clear()
    torch.testing.assert_close(dispatch.call(op, x), x * 3)
    assert [(s[0], s[1]) for s in seen] == [(caller, 2)]  # the next call: the tuned config, nothing measured
    d = dispatch.decide(op, (x,), tune=False)
    assert (d.source, d.config) == ("tuned", {"tile": 2})


def test_the_memoized_decision_is_switched_and_forgotten(background_mode):
    op = _toy(lambda cfg, x: (time.sleep(0.002 * (cfg["tile"] == 1)), x * 3)[1], [{"tile": 1}, {"tile": 2}])
    x = torch.ones(10)
    dispatch.call(op, x)
    memo_key = (op.name, op.memo_key(x), None)
    d = dispatch._memo[memo_key]
    assert d.source == "heuristic"
    assert background.drain(timeout=60)
    assert memo_key not in dispatch._memo  # the next call decides again, from the new entry
    assert (d.source, d.config) == ("tuned", {"tile": 2})  # a call that still holds it runs the tuned config


def test_explain_never_queues(background_mode, monkeypatch):
    monkeypatch.setattr(background, "submit", lambda *a, **k: pytest.fail("explain queued a bucket"))
    x = torch.ones(3000)
    assert opforge.explain("add", x, x).source == "heuristic"


def test_arguments_over_the_clone_budget_are_not_tuned(background_mode, monkeypatch):
    monkeypatch.setenv("OPFORGE_AUTOTUNE_CLONE_MB", "0.001")  # about 1 KB
    op = _toy(lambda cfg, x: x * 3, [{"tile": 1}, {"tile": 2}])
    x = torch.ones(1000)
    torch.testing.assert_close(dispatch.call(op, x), x * 3)
    assert background.pending() == 0
    assert any("clone budget" in why for why in background.skipped.values())


def test_clone_keeps_layout_and_is_independent():
    base = torch.arange(12.0)
    views = [base.reshape(3, 4).t(), base[2:8:2], base[:4].expand(3, 4), base.reshape(3, 4)]
    args = (views[0], [views[1], (views[2], 5)], None, views[3])
    clone = background._clone(args)
    flat = [clone[0], clone[1][0], clone[1][1][0], clone[3]]
    assert clone[1][1][1] == 5 and clone[2] is None
    for v, c in zip(views, flat):
        assert (c.shape, c.stride(), c.storage_offset()) == (v.shape, v.stride(), v.storage_offset())
        torch.testing.assert_close(c, v)
        assert c.untyped_storage().data_ptr() != v.untyped_storage().data_ptr()
    base.zero_()
    assert flat[3].sum() == 66.0  # the caller changed its tensor: the clone did not move


def test_add_under_the_interpreter_is_tuned_in_the_background(background_mode, gen):
    op = registry.get("add")
    x, y = torch.randn(3000, generator=gen), torch.randn(3000, generator=gen)
    d = opforge.explain("add", x, y)
    assert (d.variant.name, d.source) == ("triton_flat", "heuristic")
    torch.testing.assert_close(opforge.add(x, y), x + y)
    assert background.drain(timeout=300)
    stored = background_mode.entries()
    assert [(e.key.op, e.key.variant) for e in stored] == [("opforge::add", "triton_flat")]
    candidates = list(op.variant("triton_flat").configs(x, y))
    assert stored[0].config in candidates
    d = opforge.explain("add", x, y)
    assert (d.source, d.config) == ("tuned", stored[0].config)
    torch.testing.assert_close(opforge.add(x, y), x + y)


def test_background_mode_is_in_the_modes(monkeypatch):
    monkeypatch.setenv("OPFORGE_AUTOTUNE", "background")
    assert autotune.mode() == "background"


def test_interpreted_grids_take_turns_across_threads():
    """The interpreter patches ``triton.language`` while a grid runs: the tuning thread's grids and
    the caller's must not overlap (they did: "Did you forget to add @triton.jit?", seen in CI).
    Three threads adding at once, as the caller and the worker would."""
    import threading

    background._one_grid_at_a_time()
    errors = []

    def work(seed):
        g = torch.Generator().manual_seed(seed)
        for _ in range(15):
            x, y = torch.randn(3000, generator=g), torch.randn(3000, generator=g)
            try:
                torch.testing.assert_close(opforge.add(x, y), x + y)
            except Exception as e:  # noqa: BLE001 - counted, then asserted on
                errors.append(f"{type(e).__name__}: {str(e)[:120]}")

    threads = [threading.Thread(target=work, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:2]

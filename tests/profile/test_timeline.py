"""Dispatch hooks, NVTX ranges (no-ops without CUDA) and the per-op timeline."""

import importlib
import json

import pytest
import torch

from opforge.profile import nvtx, timeline
from opforge.runtime import hooks
from opforge.runtime import dispatch

# the module (``opforge.profile.timeline`` the attribute is the function)
timeline_module = importlib.import_module("opforge.profile.timeline")


@pytest.fixture(autouse=True)
def _no_leftover_hooks():
    before = list(hooks.HOOKS)
    yield
    assert hooks.HOOKS == before, "a hook was left installed"
    hooks.HOOKS[:] = before


def _softmax_decision(x):
    import opforge.ops.softmax  # noqa: F401  (registers the op)

    return dispatch.explain("softmax", x, -1)


def _run(decision, x):
    """What dispatch.call does while hooks listen."""
    return hooks.run_hooked(decision, decision.variant.run, decision.config, x, -1)


def test_run_hooked_order_and_exceptions():
    seen = []
    hooks.HOOKS.extend([lambda p, d: seen.append(("a", p, d)), lambda p, d: seen.append(("b", p, d))])
    try:
        assert hooks.run_hooked("D", lambda a, b: a + b, 2, 3) == 5
        assert seen == [("a", "enter", "D"), ("b", "enter", "D"), ("b", "exit", "D"), ("a", "exit", "D")]
        seen.clear()
        with pytest.raises(ZeroDivisionError):
            hooks.run_hooked("E", lambda: 1 / 0)
        assert [s[:2] for s in seen] == [("a", "enter"), ("b", "enter"), ("b", "exit"), ("a", "exit")]
    finally:
        del hooks.HOOKS[-2:]


def test_timeline_on_cpu_is_a_flagged_wall_clock(tmp_path):
    x = torch.randn(4, 16)
    d = _softmax_decision(x)
    with timeline() as tl:
        assert tl.hook in hooks.HOOKS
        outer = _run(d, x)
        # an op inside an op: depth 1
        hooks.run_hooked(d, lambda: _run(d, x))
    assert tl.hook not in hooks.HOOKS
    torch.testing.assert_close(outer, torch.softmax(x, -1))
    assert tl.clock == "wall" and "not GPU times" in tl.note
    assert [r.depth for r in tl.records] == [0, 0, 1]
    assert all(r.clock == "wall" and r.ms is not None and r.ms >= 0 for r in tl.records)
    assert tl.records[0].op == "opforge::softmax" and tl.records[0].variant == d.variant.name
    assert tl.records[1].start_ms <= tl.records[2].start_ms <= tl.records[2].end_ms <= tl.records[1].end_ms
    top, nested = tl.summary()
    assert (top["calls"], top["depth"], top["pct"]) == (2, 0, pytest.approx(100.0))
    assert (nested["calls"], nested["depth"], nested["pct"]) == (1, 1, None)
    assert top["total_ms"] == pytest.approx(tl.records[0].ms + tl.records[1].ms)
    doc = json.loads(json.dumps(tl.to_json()))
    assert doc["clock"] == "wall" and len(doc["records"]) == 3 and doc["wall_ms"] >= tl.records[-1].end_ms
    from rich.console import Console

    con = Console(record=True, width=150)
    con.print(tl.table())
    text = con.export_text()
    assert "softmax" in text and "wall" in text
    tl.plot(tmp_path / "tl.png")
    assert (tmp_path / "tl.png").stat().st_size > 1000


def test_timeline_removes_its_hook_on_error():
    with pytest.raises(RuntimeError):
        with timeline() as tl:
            raise RuntimeError("boom")
    assert tl.hook not in hooks.HOOKS and tl.clock == "none"


def test_empty_timeline():
    with timeline() as tl:
        pass
    assert tl.records == [] and tl.summary() == [] and tl.to_json()["clock"] == "none"


def test_dispatch_calls_the_hooks():
    import opforge.ops.softmax as S

    x = torch.randn(3, 8)
    with timeline() as tl:
        S.softmax(x, -1)
        torch.ops.opforge.softmax(x, 0)
    assert [r.op for r in tl.records] == ["opforge::softmax"] * 2


def test_nvtx_is_a_no_op_without_cuda(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda.nvtx, "range_push", lambda n: calls.append(("push", n)))
    monkeypatch.setattr(torch.cuda.nvtx, "range_pop", lambda: calls.append(("pop",)))
    monkeypatch.setattr(nvtx, "available", lambda: False)
    with nvtx.nvtx_range("x"):
        pass
    x = torch.randn(2, 8)
    d = _softmax_decision(x)
    with nvtx.ranges():
        _run(d, x)
    assert calls == []


def test_nvtx_ranges_name_every_op(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda.nvtx, "range_push", lambda n: calls.append(("push", n)))
    monkeypatch.setattr(torch.cuda.nvtx, "range_pop", lambda: calls.append(("pop",)))
    monkeypatch.setattr(nvtx, "available", lambda: True)
    x = torch.randn(2, 8)
    d = _softmax_decision(x)
    assert not nvtx.enabled()
    with nvtx.ranges():
        assert nvtx.enabled()
        nvtx.enable()  # idempotent
        assert hooks.HOOKS.count(nvtx._hook) == 1
        _run(d, x)
    assert not nvtx.enabled()
    assert calls == [("push", f"opforge::softmax [{d.variant.name}]"), ("pop",)]
    _run(d, x)  # disabled: no more ranges
    assert len(calls) == 2


def test_nvtx_from_environment(monkeypatch):
    monkeypatch.setenv("OPFORGE_NVTX", "1")
    try:
        timeline_module._nvtx_from_env()
        assert nvtx.enabled()
    finally:
        nvtx.disable()
    monkeypatch.setenv("OPFORGE_NVTX", "0")
    timeline_module._nvtx_from_env()
    assert not nvtx.enabled()

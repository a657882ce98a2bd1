"""Cached roofline ceilings are not trusted forever (issue 25: the demo's CPU
roofline showed 777 % from a copy ceiling measured badly once and cached).

A ceiling is measured again when the software versions differ from those it
was measured under, when the cached value is not a sane number, and when a
bench run finds an op above 100 % of it; a figure still above 100 % after that
is reported as such, never capped."""

from __future__ import annotations

import json

import pytest
import torch
from rich.console import Console

from opforge.bench import harness
from opforge.runtime import cache, roofline
from opforge.runtime import device as devmod

CPU = torch.device("cpu")


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(tmp_path))
    return cache.autotune_cache()


@pytest.fixture
def measured(monkeypatch):
    """measure_ceilings replaced by a queue of known results (each call pops one)."""
    queue, calls = [], []

    def fake(dev, *, quick=False):
        calls.append(quick)
        return queue.pop(0)

    monkeypatch.setattr(roofline, "measure_ceilings", fake)
    return queue, calls


def _c(copy_tbps, tflops=1.0):
    return roofline.Ceilings(copy_tbps, tflops, "2026-12-01", "test")


def test_a_cached_ceiling_is_reused_while_the_versions_are_the_same(fresh_cache, measured):
    queue, calls = measured
    queue += [_c(0.05)]
    assert roofline.ceilings(CPU, quick=True).copy_tbps == 0.05
    assert roofline.ceilings(CPU, quick=True).copy_tbps == 0.05
    assert len(calls) == 1


@pytest.mark.parametrize("field", ["opforge", "triton", "torch", "driver"])
def test_a_new_software_version_measures_again(fresh_cache, measured, monkeypatch, field):
    queue, calls = measured
    queue += [_c(0.05), _c(0.07)]
    roofline.ceilings(CPU, quick=True)
    real = devmod.versions()
    monkeypatch.setattr(devmod, "versions", lambda: {**real, field: real[field] + ".post1"})
    assert roofline.ceilings(CPU, quick=True).copy_tbps == 0.07
    assert len(calls) == 2


@pytest.mark.parametrize("junk", ['{"copy_tbps": 0, "bf16_tflops": 1, "measured_on": "", "method": ""}',
                                  '{"copy_tbps": "fast"}', "not json"])
def test_a_cached_ceiling_that_is_not_sane_is_measured_again(fresh_cache, measured, junk):
    queue, calls = measured
    queue += [_c(0.05), _c(0.06)]
    roofline.ceilings(CPU, quick=True)
    con = fresh_cache._connect()
    con.execute("UPDATE ceilings SET value = ?", (junk,))
    fresh_cache._memory_ceilings.clear()
    assert roofline.ceilings(CPU, quick=True).copy_tbps == 0.06


def _bench(**kw):
    return harness.run(quick=True, families=["softmax"], crossover=False, host=False, console=Console(quiet=True),
                       **kw)


def test_an_op_above_100_percent_measures_the_ceilings_again(fresh_cache, measured):
    queue, calls = measured
    queue += [_c(1e-9, 1e-9), _c(1e6, 1e6)]  # a ceiling measured badly, then a sane one
    result = _bench()
    assert len(calls) == 2
    assert result["ceilings"]["copy_tbps"] == 1e6
    assert all(e["pct_roofline"] <= 100 for e in result["entries"])
    assert "warning" not in result["ceilings"]
    stored = [json.loads(v) for (v,) in fresh_cache._connect().execute("SELECT value FROM ceilings")]
    assert [s["copy_tbps"] for s in stored] == [1e6]  # the bad one is not kept


def test_a_figure_still_above_100_percent_is_reported_not_capped(fresh_cache, measured):
    queue, calls = measured
    queue += [_c(1e-9, 1e-9), _c(1e-9, 1e-9)]
    result = _bench()
    assert len(calls) == 2
    over = [e for e in result["entries"] if e["pct_roofline"] > 100]
    assert over and max(e["pct_roofline"] for e in over) > 1e3  # the true ratio, not 100
    assert "above 100 %" in result["ceilings"]["warning"]

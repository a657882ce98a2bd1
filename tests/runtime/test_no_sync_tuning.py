"""Issue 23: no tuning inside a user's work.

With ``OPFORGE_AUTOTUNE`` unset (the default mode, ``cached``), an op call or
``con.sql(...)`` on shapes that have no cache entry never benchmarks a
candidate: ``autotune.measure_configs``, ``autotune.tune`` and
``timing.bench`` fail the test if anything reaches them. ``on`` still tunes
inside the call (the control: the same instrumentation sees it).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

import opforge
from opforge.runtime import autotune, cache, dispatch, timing


@pytest.fixture
def default_mode(tmp_path, monkeypatch):
    """OPFORGE_AUTOTUNE unset (tests/conftest.py sets it to off), an empty user cache."""
    monkeypatch.delenv("OPFORGE_AUTOTUNE", raising=False)
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(tmp_path / "cache"))
    dispatch.reset()
    assert autotune.mode() == "cached"
    assert cache.autotune_cache().entries() == []


@pytest.fixture
def no_benchmarking(monkeypatch):
    def fail(*args, **kwargs):
        pytest.fail("a candidate was benchmarked inside a user's call")

    monkeypatch.setattr(autotune, "measure_configs", fail)
    monkeypatch.setattr(autotune, "tune", fail)
    monkeypatch.setattr(timing, "bench", fail)
    monkeypatch.setattr(timing, "bench_cpu", fail)


def _ops_on_fresh_shapes(g: torch.Generator) -> None:
    """A few families under the interpreter, each checked against torch."""
    x, y = torch.randn(3000, generator=g), torch.randn(3000, generator=g)
    torch.testing.assert_close(opforge.add(x, y), x + y)
    m = torch.randn(37, 300, generator=g)
    torch.testing.assert_close(opforge.gelu(m), torch.nn.functional.gelu(m))
    torch.testing.assert_close(opforge.softmax(m, dim=-1), torch.softmax(m, dim=-1))
    ints = torch.randint(-5, 5, (2, 700), generator=g)
    torch.testing.assert_close(opforge.cumsum(ints, dim=-1), torch.cumsum(ints, dim=-1))
    a, b = torch.randn(40, 72, generator=g), torch.randn(72, 24, generator=g)
    torch.testing.assert_close(opforge.matmul(a, b), a @ b, rtol=1e-4, atol=1e-4)


def test_op_calls_never_benchmark_in_the_default_mode(default_mode, no_benchmarking, gen):
    _ops_on_fresh_shapes(gen)
    assert cache.autotune_cache().entries() == []


def test_default_mode_decisions_say_heuristic_without_entries(default_mode, no_benchmarking, gen):
    x = torch.randn(3000, generator=gen)
    d = opforge.explain("add", x, x)
    assert (d.variant.name, d.source) == ("triton_flat", "heuristic")
    assert d.config == d.variant.default_config(x, x)
    assert "[heuristic]" in str(d).splitlines()[0]


def test_tuning_on_still_tunes_inside_the_call(tmp_path, monkeypatch, gen):
    """The control: OPFORGE_AUTOTUNE=on benchmarks inside the call, once per bucket."""
    monkeypatch.setenv("OPFORGE_AUTOTUNE", "on")
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(tmp_path / "cache"))
    dispatch.reset()
    measured = []
    real = autotune.measure_configs

    def counting(variant, args, configs, device, **kw):
        measured.append((variant.name, len(configs)))
        return real(variant, args, configs, device, quick=True)

    monkeypatch.setattr(autotune, "measure_configs", counting)
    x, y = torch.randn(3000, generator=gen), torch.randn(3000, generator=gen)
    torch.testing.assert_close(opforge.add(x, y), x + y)
    assert measured and measured[0][0] == "triton_flat" and measured[0][1] > 1
    stored = cache.autotune_cache().entries()
    assert [(e.key.op, e.key.variant) for e in stored] == [("opforge::add", "triton_flat")]
    d = opforge.explain("add", x, y)
    assert d.source == "tuned" and d.config == stored[0].config
    measured.clear()
    torch.testing.assert_close(opforge.add(y, x), x + y)
    assert measured == []  # the bucket is tuned: no second measurement


# ---------------------------------------------------------------------------
# con.sql(...) on TPC-H SF 0.01, the hash ops through dispatch's own choice (the Triton kernels)
# ---------------------------------------------------------------------------
TPCH_QUERIES = (6, 3)  # a scan-aggregate and a three-table join with group-by, top-k


@pytest.fixture(scope="module")
def tpch(tmp_path_factory):
    from opforge.sql.tpch import data, reference

    try:
        data.tpchgen_executable()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    root = Path(os.environ["OPFORGE_CACHE_DIR"]) / "tpch"
    paths = data.generate(0.01, root)
    return paths, reference.answers(0.01, root, numbers=TPCH_QUERIES)


def test_sql_queries_never_benchmark_in_the_default_mode(tpch, default_mode, no_benchmarking):
    import opforge.sql as sql
    from opforge.sql.tpch import compare, queries, runner

    paths, answers = tpch
    con = sql.connect("cpu")
    runner.register_tables(con, paths)
    for n in TPCH_QUERIES:
        text = queries.query(n)
        ours = con.sql(text).to_arrow()
        keys = compare.order_keys(text)
        assert compare.compare(ours, answers[n], ordered=keys is not None, order_by=keys) == [], n
    assert cache.autotune_cache().entries() == []

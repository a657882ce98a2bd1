"""One bad row in the autotune cache never breaks a call, ``doctor`` or
``tune --export``, and ``tune --import`` refuses bad rows by line (issue 25).

A row is bad when its config is not JSON, not an object, its time not a
number, its config not shaped like the variant's candidates (other keys, other
value types, a block that is not a power of two such as ``BLOCK=3``), or when
the config fails at launch. Such a row is dropped with one warning and the call
runs with the variant's default config.
"""

from __future__ import annotations

import json
import sqlite3
import warnings
from dataclasses import asdict
from types import SimpleNamespace

import pytest
import torch
from rich.console import Console

import opforge  # noqa: F401  (registers the ops)
from opforge import tune
from opforge.runtime import autotune, cache, dispatch, registry
from opforge.runtime.cache import AutotuneCache, TuneEntry
from opforge.runtime.registry import Op, Variant


@pytest.fixture
def user_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("OPFORGE_AUTOTUNE", "off")
    return cache.autotune_cache()


def _add_args():
    g = torch.Generator().manual_seed(7)
    return torch.randn(64, generator=g), torch.randn(64, generator=g)


def _raw_row(c: AutotuneCache, key, config_text: str, median=0.5) -> None:
    """A row written behind the cache's back (another version, a crash, a hand edit)."""
    con = sqlite3.connect(str(c.path))
    con.execute("INSERT OR REPLACE INTO entries VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (key.text(), *asdict(key).values(), config_text, median, 1.0))
    con.commit()
    con.close()
    c._memory.clear()


def _stored(c: AutotuneCache) -> int:
    con = sqlite3.connect(str(c.path))
    try:
        return con.execute("SELECT count(*) FROM entries").fetchone()[0]
    finally:
        con.close()


def _rt(record):
    return [str(w.message) for w in record if issubclass(w.category, RuntimeWarning)]


BAD_ROWS = {
    "not json": ("{BLOCK: 1024", 0.5),
    "not an object": ("[1024, 4]", 0.5),
    "time not a number": ('{"BLOCK": 1024, "num_warps": 4}', "fast"),
    "not a power of two": ('{"BLOCK": 3, "num_warps": 4}', 0.5),
    "other keys": ('{"BLOK": 1024, "num_warps": 4}', 0.5),
    "other value type": ('{"BLOCK": "1024", "num_warps": 4}', 0.5),
}


@pytest.mark.parametrize("what", sorted(BAD_ROWS))
def test_a_bad_row_is_dropped_with_one_warning_and_the_call_runs_the_default(user_cache, what):
    op = registry.get("add")
    v = op.variant("triton_flat")
    x, y = _add_args()
    key = autotune.tune_key(op, v, (x, y))
    _raw_row(user_cache, key, *BAD_ROWS[what])
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        out = dispatch.call(op, x, y)
        dispatch.reset()
        again = dispatch.call(op, x, y)
    torch.testing.assert_close(out, x + y)
    torch.testing.assert_close(again, x + y)
    msgs = _rt(record)
    assert len(msgs) == 1, msgs
    assert "opforge::add" in msgs[0] and "triton_flat" in msgs[0] and "default config" in msgs[0]
    d = dispatch.decide(op, (x, y))
    assert (d.variant.name, d.source, d.config) == ("triton_flat", "default", v.default_config(x, y))
    assert _stored(user_cache) == 0  # dropped from the file, not only skipped


def test_a_good_row_is_still_used(user_cache):
    op = registry.get("add")
    v = op.variant("triton_flat")
    x, y = _add_args()
    _raw_row(user_cache, autotune.tune_key(op, v, (x, y)), '{"BLOCK": 2048, "num_warps": 4}')
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        d = dispatch.decide(op, (x, y))
    assert (d.source, d.config) == ("tuned", {"BLOCK": 2048, "num_warps": 4})


def _picky_op():
    """A variant whose config BLOCK=256 is shaped right but fails at launch."""
    launched = []

    def run(cfg, x):
        launched.append(cfg["BLOCK"])
        if cfg["BLOCK"] == 256:
            raise RuntimeError("out of resources: shared memory")
        return x * 2

    v = Variant("picky", run, kind="vendor", devices=("cpu",), configs=lambda x: [{"BLOCK": 64}, {"BLOCK": 128}],
                default_config=lambda x: {"BLOCK": 64}, bucket=lambda x: str(x.numel()))
    op = Op(name="test_picky", reference=lambda x: x * 2, tensors=lambda x: (x,), memo_key=lambda x: (x.shape,),
            dtype_key=lambda x: str(x.dtype).replace("torch.", ""), variants=[v])
    return op, v, launched


def test_a_config_that_fails_at_launch_is_dropped_and_the_call_reruns_with_the_default(user_cache):
    op, v, launched = _picky_op()
    x = torch.arange(8.0)
    user_cache.put(TuneEntry(autotune.tune_key(op, v, (x,)), {"BLOCK": 256}, 0.1))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        first = dispatch.call(op, x)
        second = dispatch.call(op, x)  # memoized: the default now, no second failure
        dispatch.reset()
        third = dispatch.call(op, x)  # decided again: the row is gone
    for out in (first, second, third):
        torch.testing.assert_close(out, x * 2)
    assert launched == [256, 64, 64, 64]
    msgs = _rt(record)
    assert len(msgs) == 1 and "failed at launch" in msgs[0] and "out of resources" in msgs[0], msgs
    assert user_cache.entries() == [] and AutotuneCache(user_cache.path).entries() == []


def test_a_default_config_that_fails_still_raises(user_cache):
    op, v, _ = _picky_op()
    bad = Variant("picky", lambda cfg, x: (_ for _ in ()).throw(RuntimeError("kernel bug")), kind="vendor",
                  devices=("cpu",), configs=v.configs, default_config=v.default_config, bucket=v.bucket)
    op.variants = [bad]
    with pytest.raises(RuntimeError, match="kernel bug"):
        dispatch.call(op, torch.arange(8.0))


def test_a_bad_shipped_row_is_dropped_too(user_cache, monkeypatch):
    op = registry.get("add")
    v = op.variant("triton_flat")
    x, y = _add_args()
    key = autotune.tune_key(op, v, (x, y))
    table = cache.ShippedTable()
    table._entries = {key.text(): TuneEntry(key, {"BLOCK": 3, "num_warps": 4}, 0.1)}
    monkeypatch.setattr(autotune, "shipped", table)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        torch.testing.assert_close(dispatch.call(op, x, y), x + y)
        dispatch.reset()
        dispatch.call(op, x, y)
    assert len(_rt(record)) == 1 and "shipped" in _rt(record)[0]
    assert table.get(key) is None


def test_entries_doctor_and_export_skip_bad_rows(user_cache, tmp_path):
    op = registry.get("add")
    v = op.variant("triton_flat")
    x, y = _add_args()
    good = TuneEntry(autotune.tune_key(op, v, (x, y)), {"BLOCK": 2048, "num_warps": 4}, 0.5, created=3.0)
    user_cache.put(good)
    other = autotune.tune_key(op, v, (torch.randn(300), torch.randn(300)))
    _raw_row(user_cache, other, "{oops", 0.5)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert user_cache.entries() == [good]
        assert user_cache.export_jsonl(tmp_path / "out.jsonl") == 1
        from opforge import doctor

        doctor.run(Console(file=open(tmp_path / "doctor.txt", "w"), width=200))
    assert any("{oops" in m or "not JSON" in m for m in _rt(record))
    assert cache.read_jsonl((tmp_path / "out.jsonl").read_text()) == [good]
    args = SimpleNamespace(clear=False, import_path=None, preset=None, op=None, family=None,
                           export_path=str(tmp_path / "again.jsonl"), quick=True)
    assert tune.run(args, Console(quiet=True)) == 0


def test_import_refuses_bad_rows_naming_their_lines(user_cache, tmp_path):
    op = registry.get("add")
    v = op.variant("triton_flat")
    x, y = _add_args()
    key = asdict(autotune.tune_key(op, v, (x, y)))
    good = {"key": key, "config": {"BLOCK": 2048, "num_warps": 4}, "median_ms": 0.5}
    lines = [
        json.dumps(good),                                                        # 1 ok
        "{not json",                                                             # 2
        json.dumps({**good, "config": {"BLOCK": 3, "num_warps": 4}}),            # 3 impossible
        json.dumps({**good, "config": [1, 2]}),                                  # 4 wrong type
        json.dumps({**good, "median_ms": "fast"}),                               # 5 wrong type
        "",                                                                      # blank: fine
        json.dumps({**good, "key": {**key, "variant": "no_such_variant"}}),      # 7 unknown variant
        json.dumps({**good, "key": {**key, "sm_count": "many"}}),                # 8 wrong type
        json.dumps({**good, "key": {**key, "shape_bucket": "128"}}),             # 9 ok
    ]
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(lines) + "\n")
    out = tmp_path / "console.txt"
    args = SimpleNamespace(clear=False, import_path=str(path), preset=None, op=None, family=None, export_path=None,
                           quick=True)
    with open(out, "w") as f:
        rc = tune.run(args, Console(file=f, width=300))
    text = out.read_text()
    assert rc == 1
    for n in (2, 3, 4, 5, 7, 8):
        assert f"{path}:{n}:" in text, text
    assert f"{path}:1:" not in text and f"{path}:9:" not in text
    assert "imported 2 entries" in text and "6 refused" in text
    assert len(AutotuneCache(user_cache.path).entries()) == 2


def test_an_error_that_the_default_config_raises_too_keeps_the_row(user_cache):
    """Not the config's fault (the default fails alike): the row stays, the first error is raised."""
    op, v, _ = _picky_op()
    bad = Variant("picky", lambda cfg, x: (_ for _ in ()).throw(RuntimeError(f"bad input {cfg}")), kind="vendor",
                  devices=("cpu",), configs=v.configs, default_config=v.default_config, bucket=v.bucket)
    op.variants = [bad]
    x = torch.arange(8.0)
    user_cache.put(TuneEntry(autotune.tune_key(op, bad, (x,)), {"BLOCK": 128}, 0.1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(RuntimeError, match="bad input {'BLOCK': 128}"):
            dispatch.call(op, x)
    assert len(user_cache.entries()) == 1

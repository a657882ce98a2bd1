"""Specification tests for the persistent autotune cache and the autotuner.

What the cache promises (``opforge.runtime.cache`` docstring, DESIGN.md):
SQLite in WAL mode at ``$OPFORGE_CACHE_DIR/autotune.sqlite`` with one schema
version; JSON lines in and out; an entry is never reused where any field of
its key differs; many processes may write at once without losing or tearing
rows; a corrupted file or a foreign schema is ignored with one warning and
results then stay in memory.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sqlite3
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import opforge  # noqa: F401  (registers the ops)
from opforge.runtime import autotune, cache, dispatch, registry
from opforge.runtime.cache import SCHEMA_VERSION, AutotuneCache, TuneEntry, TuneKey
from opforge.runtime.registry import Op, Variant

REPO_ROOT = Path(__file__).resolve().parents[2]

BASE_KEY = TuneKey(
    op="opforge::add",
    variant="triton_flat",
    kernel_version="1",
    triton="3.6.0",
    torch="2.13.0",
    gpu="NVIDIA H200",
    sm_count=132,
    dtype="float32,float32",
    shape_bucket="4096",
)

# One different value for every field of the key.
OTHER_VALUE = {
    "op": "opforge::mul",
    "variant": "triton_strided",
    "kernel_version": "2",
    "triton": "3.5.1",
    "torch": "2.12.0",
    "gpu": "NVIDIA H100 80GB HBM3",
    "sm_count": 114,
    "dtype": "bfloat16,bfloat16",
    "shape_bucket": "8192",
}


def _entry(i: int, **key_fields) -> TuneEntry:
    key = dataclasses.replace(BASE_KEY, shape_bucket=f"b{i}", **key_fields)
    # Values that survive a round trip only if stored exactly (no rounding,
    # no truncation): odd floats, nested config values.
    return TuneEntry(
        key,
        {"BLOCK": 64 << (i % 6), "num_warps": 4 if i % 2 else 8, "tag": f"cfg-{i}", "tile": [i, i + 1]},
        median_ms=0.001 + i / 7.0,
        created=1_700_000_000.25 + i,
    )


def _by_key(entries):
    return {e.key.text(): e for e in entries}


def _rt_warnings(record):
    return [w for w in record if issubclass(w.category, RuntimeWarning)]


# ---------------------------------------------------------------------------
# Round trip, file format
# ---------------------------------------------------------------------------
def test_put_reopen_get_round_trip(tmp_path):
    path = tmp_path / "autotune.sqlite"
    written = [_entry(i) for i in range(12)]
    c1 = AutotuneCache(path)
    assert c1.usable
    c1.put(written[0])
    assert c1.put_many(written[1:]) == 11

    c2 = AutotuneCache(path)  # a new object: nothing in its memory, all from the file
    for e in written:
        got = c2.get(e.key)
        assert got == e, e.key
    assert _by_key(c2.entries()) == _by_key(written)
    assert len(c2.entries()) == 12


def test_put_replaces_an_entry_with_the_same_key(tmp_path):
    path = tmp_path / "autotune.sqlite"
    c = AutotuneCache(path)
    old = TuneEntry(BASE_KEY, {"BLOCK": 1024}, 2.5, created=1.0)
    new = TuneEntry(BASE_KEY, {"BLOCK": 4096}, 1.25, created=2.0)
    c.put(old)
    c.put(new)
    reopened = AutotuneCache(path)
    assert reopened.get(BASE_KEY) == new
    assert len(reopened.entries()) == 1


def test_export_jsonl_import_into_fresh_cache(tmp_path):
    src = AutotuneCache(tmp_path / "a" / "autotune.sqlite")
    written = [_entry(i) for i in range(9)] + [_entry(0, gpu="NVIDIA H100", sm_count=114)]
    src.put_many(written)

    out = tmp_path / "export.jsonl"
    assert src.export_jsonl(out) == len(written)
    lines = [ln for ln in out.read_text().splitlines() if ln.strip()]
    assert len(lines) == len(written)
    for ln in lines:  # each line is one self-contained JSON object
        d = json.loads(ln)
        assert set(d) == {"key", "config", "median_ms", "created"}

    dst = AutotuneCache(tmp_path / "b" / "autotune.sqlite")
    assert dst.entries() == []
    assert dst.import_jsonl(out) == len(written)
    assert _by_key(AutotuneCache(tmp_path / "b" / "autotune.sqlite").entries()) == _by_key(written)


def test_file_is_wal_with_schema_version(tmp_path):
    path = tmp_path / "autotune.sqlite"
    AutotuneCache(path).put(_entry(1))
    con = sqlite3.connect(str(path))
    try:
        assert con.execute("PRAGMA journal_mode").fetchone()[0].lower() == "wal"
        (version,) = con.execute("SELECT value FROM meta WHERE name = 'schema_version'").fetchone()
        assert int(version) == SCHEMA_VERSION
        # the row is stored with its key fields in columns, config as JSON
        row = con.execute("SELECT op, sm_count, config, median_ms FROM entries").fetchone()
        assert row[0] == "opforge::add" and row[1] == 132
        assert json.loads(row[2]) == _entry(1).config
        assert row[3] == _entry(1).median_ms
    finally:
        con.close()


def test_process_cache_lives_in_opforge_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(tmp_path / "here"))
    c = cache.autotune_cache()
    assert c.path == tmp_path / "here" / "autotune.sqlite"
    assert cache.autotune_cache() is c  # one object per folder
    c.put(_entry(3))
    assert (tmp_path / "here" / "autotune.sqlite").exists()
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(tmp_path / "there"))
    other = cache.autotune_cache()
    assert other is not c and other.get(_entry(3).key) is None


# ---------------------------------------------------------------------------
# Key invalidation
# ---------------------------------------------------------------------------
def test_other_value_covers_every_key_field():
    assert set(OTHER_VALUE) == {f.name for f in dataclasses.fields(TuneKey)}


@pytest.mark.parametrize("field_name", sorted(OTHER_VALUE))
def test_entry_not_returned_for_key_differing_in_one_field(tmp_path, field_name):
    path = tmp_path / "autotune.sqlite"
    entry = TuneEntry(BASE_KEY, {"BLOCK": 2048, "num_warps": 8}, 0.75)
    writer = AutotuneCache(path)
    writer.put(entry)
    other = dataclasses.replace(BASE_KEY, **{field_name: OTHER_VALUE[field_name]})
    assert other != BASE_KEY and other.text() != BASE_KEY.text()

    # neither the writing object (memory) nor a fresh reader (file) returns it
    assert writer.get(other) is None
    reader = AutotuneCache(path)
    assert reader.get(other) is None
    assert reader.get(BASE_KEY) == entry
    assert autotune.lookup(other, reader) == (None, "")
    assert autotune.lookup(BASE_KEY, reader) == (entry, "tuned")


def _small_add_args(gen, n=64):
    return (torch.randn(n, generator=gen), torch.randn(n, generator=gen))


def test_tune_key_describes_this_environment(gen):
    import triton

    from opforge.kernels import elementwise as K

    op = registry.get("add")
    key = autotune.tune_key(op, op.variant("triton_flat"), _small_add_args(gen, 64))
    assert key.op == "opforge::add"
    assert key.variant == "triton_flat"
    assert key.kernel_version == K.FLAT_VERSION
    assert key.triton == triton.__version__
    assert key.torch == torch.__version__.split("+")[0]
    assert key.gpu == "cpu-interpreter"  # conftest sets OPFORGE_INTERPRET=1
    assert key.sm_count == (os.cpu_count() or 1)
    assert key.dtype == "float32,float32"
    assert key.shape_bucket == "64"
    # sizes above 16 share a power-of-two bucket
    assert autotune.tune_key(op, op.variant("triton_flat"), _small_add_args(gen, 100)).shape_bucket == "128"
    x = torch.randn(8, generator=gen, dtype=torch.float64)
    assert autotune.tune_key(op, op.variant("triton_flat"), (x, x + 1)).dtype == "float64,float64"


def test_kernel_version_bump_invalidates_entry(tmp_path, gen):
    op = registry.get("add")
    variant = op.variant("triton_flat")
    args = _small_add_args(gen)
    c = AutotuneCache(tmp_path / "autotune.sqlite")
    key = autotune.tune_key(op, variant, args)
    entry = TuneEntry(key, {"BLOCK": 2048, "num_warps": 4}, 0.5)
    c.put(entry)
    assert autotune.lookup(key, c) == (entry, "tuned")

    bumped = dataclasses.replace(variant, version="999")
    new_key = autotune.tune_key(op, bumped, args)
    assert new_key.kernel_version == "999"
    assert autotune.lookup(new_key, c) == (None, "")
    assert autotune.lookup(new_key, AutotuneCache(tmp_path / "autotune.sqlite")) == (None, "")


def test_kernel_version_bump_changes_dispatch(tmp_path, monkeypatch, gen):
    """Through dispatch: a tuned config is used until the kernel's version changes."""
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("OPFORGE_AUTOTUNE", "off")
    op = registry.get("add")
    variant = op.variant("triton_flat")
    x, y = _small_add_args(gen)
    tuned_cfg = {"BLOCK": 2048, "num_warps": 4}
    assert tuned_cfg != variant.default_config(x, y)
    cache.autotune_cache().put(TuneEntry(autotune.tune_key(op, variant, (x, y)), tuned_cfg, 0.5))

    d = dispatch.decide(op, (x, y))
    assert (d.variant.name, d.source, d.config) == ("triton_flat", "tuned", tuned_cfg)

    monkeypatch.setattr(variant, "version", "999")
    dispatch.reset()
    d = dispatch.decide(op, (x, y))
    assert d.variant.name == "triton_flat"
    assert d.source == "default"
    assert d.config == variant.default_config(x, y) != tuned_cfg


# ---------------------------------------------------------------------------
# Corrupted or foreign files: one warning, then memory
# ---------------------------------------------------------------------------
def _assert_falls_back_to_memory(path: Path):
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        c = AutotuneCache(path)  # must not raise
        assert not c.usable
        assert c.get(BASE_KEY) is None
        entry = TuneEntry(BASE_KEY, {"BLOCK": 512, "num_warps": 4}, 0.125)
        c.put(entry)
        assert c.get(BASE_KEY) == entry
        more = [_entry(i) for i in range(3)]
        assert c.put_many(more) == 3
        assert all(c.get(e.key) == e for e in more)
        assert _by_key(c.entries()) == _by_key([entry, *more])
    rt = _rt_warnings(record)
    assert len(rt) == 1, [str(w.message) for w in rt]
    assert str(path) in str(rt[0].message)
    return c


def test_garbage_file_warns_once_and_uses_memory(tmp_path):
    path = tmp_path / "autotune.sqlite"
    garbage = bytes((i * 37 + 11) % 251 + 1 for i in range(8192))  # no zero bytes, not SQLite
    path.write_bytes(garbage)
    _assert_falls_back_to_memory(path)
    assert path.read_bytes() == garbage  # the damaged file is left for the user to inspect


def test_foreign_schema_version_warns_once_and_uses_memory(tmp_path):
    path = tmp_path / "autotune.sqlite"
    foreign = SCHEMA_VERSION + 7
    con = sqlite3.connect(str(path))
    con.execute("CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)")
    con.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(foreign),))
    con.commit()
    con.close()

    c = _assert_falls_back_to_memory(path)
    del c
    # the foreign file keeps its version and gains none of our tables
    con = sqlite3.connect(str(path))
    try:
        assert con.execute("SELECT value FROM meta WHERE name='schema_version'").fetchone()[0] == str(foreign)
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert tables == {"meta"}
    finally:
        con.close()


def test_damaged_pages_never_crash_entries(tmp_path):
    clean_path = tmp_path / "clean.sqlite"
    c = AutotuneCache(clean_path)
    written = [TuneEntry(dataclasses.replace(BASE_KEY, shape_bucket=str(i)),
                         {"BLOCK": i + 1, "pad": "y" * (50 + (i % 7) * 900)}, 0.5 + i) for i in range(600)]
    c.put_many(written)
    con = sqlite3.connect(str(clean_path))
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()
    clean = clean_path.read_bytes()
    page = 4096
    for pg in range(2, len(clean) // page):
        data = bytearray(clean)
        data[pg * page:(pg + 1) * page] = bytes((j * 7) % 251 + 1 for j in range(page))
        path = tmp_path / f"damaged-{pg}" / "autotune.sqlite"
        path.parent.mkdir()
        path.write_bytes(bytes(data))
        probe = sqlite3.connect(str(path))
        try:
            probe.execute("SELECT * FROM entries").fetchall()
            continue  # this page did not hold table rows
        except sqlite3.DatabaseError:
            pass
        finally:
            probe.close()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            damaged = AutotuneCache(path)
            if not damaged.usable:
                continue  # caught at open: the documented path
            got = damaged.entries()  # must warn and fall back, never raise
        assert isinstance(got, list)
        return
    pytest.skip("no page layout that opens cleanly but reads damaged")


def test_memory_only_cache_has_no_file(tmp_path):
    c = AutotuneCache(None)
    assert not c.usable
    e = _entry(5)
    c.put(e)
    assert c.get(e.key) == e
    assert c.get(BASE_KEY) is None


# ---------------------------------------------------------------------------
# tune(): measure the candidates, store the fastest
# ---------------------------------------------------------------------------
def _sleepy_op(configs):
    def run(cfg, x):
        if cfg.get("boom"):
            raise RuntimeError("this config does not compile")
        time.sleep(cfg["delay"])
        return x * 2

    v = Variant("sleepy", run, kind="vendor", devices=("cpu",), configs=lambda x: configs,
                bucket=lambda x: str(x.numel()))
    op = Op(name="test_autotune_sleepy", reference=lambda x: x * 2, tensors=lambda x: (x,),
            memo_key=lambda x: (x.shape,), dtype_key=lambda x: str(x.dtype).replace("torch.", ""),
            variants=[v])
    return op, v


def test_tune_stores_the_fastest_config_and_skips_failures(tmp_path, gen):
    configs = [{"boom": True}, {"delay": 0.004}, {"delay": 0.0}, {"delay": 0.002}]
    op, v = _sleepy_op(configs)
    x = torch.randn(10, generator=gen)
    c = AutotuneCache(tmp_path / "autotune.sqlite")
    entry = autotune.tune(op, v, (x,), cache=c, quick=True)
    assert entry is not None
    assert entry.config == {"delay": 0.0}
    assert 0 < entry.median_ms < 2.0  # faster than the 2 ms config
    assert entry.key == autotune.tune_key(op, v, (x,))
    assert entry.key.shape_bucket == "10" and entry.key.dtype == "float32"
    assert AutotuneCache(tmp_path / "autotune.sqlite").get(entry.key) == entry


def test_tune_with_no_working_config_stores_nothing(tmp_path, gen):
    op, v = _sleepy_op([{"boom": True}, {"boom": True}])
    x = torch.randn(10, generator=gen)
    c = AutotuneCache(tmp_path / "autotune.sqlite")
    assert autotune.tune(op, v, (x,), cache=c, quick=True) is None
    assert c.entries() == []


def test_tune_real_kernel_under_interpreter(tmp_path, gen):
    op = registry.get("mul")
    v = op.variant("triton_flat")
    x, y = _small_add_args(gen, 100)
    c = AutotuneCache(tmp_path / "autotune.sqlite")
    entry = autotune.tune(op, v, (x, y), cache=c, quick=True)
    assert entry is not None
    assert entry.config in list(v.configs(x, y))
    assert entry.median_ms > 0
    assert AutotuneCache(tmp_path / "autotune.sqlite").get(entry.key) == entry
    # the winning config computes the right thing
    torch.testing.assert_close(v.run(entry.config, x, y), x * y)


# ---------------------------------------------------------------------------
# Many processes tuning into one file at once
# ---------------------------------------------------------------------------
_WORKER = textwrap.dedent(
    r"""
    import json, os, sys, time, warnings
    from pathlib import Path
    warnings.simplefilter("always")
    import torch
    import opforge
    from opforge.runtime import autotune, cache, registry
    from opforge.runtime.cache import TuneEntry, TuneKey

    idx, go, out = int(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    ops = ("add", "mul", "sub", "maximum")
    gen = torch.Generator().manual_seed(100 + idx)
    # everything imported and compiled-free; wait for the others
    deadline = time.time() + 60
    while not go.exists():
        if time.time() > deadline:
            sys.exit("barrier timeout")
        time.sleep(0.002)

    c = cache.autotune_cache()          # every process opens the fresh file at once
    written = []

    def synthetic(j):
        key = TuneKey(op=f"opforge::synthetic{idx}", variant="v", kernel_version="1", triton="t",
                      torch="p", gpu="g", sm_count=idx + 1, dtype="float32", shape_bucket=str(j))
        cfg = {"proc": idx, "j": j, "BLOCK": 1 << (j % 12), "name": "x" * (j % 50)}
        return TuneEntry(key, cfg, median_ms=idx * 1000 + j / 7.0 + 1e-9, created=1e9 + j)

    batch = [synthetic(j) for j in range(150)]
    for s in range(0, 150, 25):            # several small batches ...
        c.put_many(batch[s:s + 25])
        written += batch[s:s + 25]
    op = registry.get(ops[idx])
    for n in (64, 256, 512):               # ... real tuning through the interpreter ...
        args = (torch.randn(n, generator=gen), torch.rand(n, generator=gen) + 0.5)
        e = autotune.tune(op, op.variant("triton_flat"), args, quick=True)
        assert e is not None
        written.append(e)
    for j in range(150, 200):              # ... and one row at a time
        e = synthetic(j)
        c.put(e)
        written.append(e)
    assert c.usable, "the cache fell back to memory"
    out.write_text("".join(e.to_json() + "\n" for e in written))
    """
)


def test_four_processes_write_one_cache_at_once(tmp_path):
    shared = tmp_path / "shared-cache"
    go = tmp_path / "go"
    env = dict(os.environ)
    env.update(OPFORGE_INTERPRET="1", TRITON_INTERPRET="1", OPFORGE_CACHE_DIR=str(shared),
               OPFORGE_AUTOTUNE="off", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    outs = [tmp_path / f"written-{i}.jsonl" for i in range(4)]
    procs = [
        subprocess.Popen([sys.executable, "-c", _WORKER, str(i), str(go), str(outs[i])], env=env,
                         cwd=str(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for i in range(4)
    ]
    time.sleep(0.5)
    go.touch()
    results = []
    try:
        for p in procs:
            results.append(p.communicate(timeout=90))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, (stdout, stderr) in zip(procs, results):
        assert p.returncode == 0, stderr[-4000:]
        assert "autotune cache" not in stderr, stderr[-4000:]  # no fallback warning

    expected = {}
    for o in outs:
        for e in cache.read_jsonl(o.read_text()):
            assert e.key.text() not in expected  # the workers' keys are distinct
            expected[e.key.text()] = e
    assert len(expected) == 4 * (200 + 3)

    stored = AutotuneCache(shared / "autotune.sqlite")
    assert stored.usable
    got = _by_key(stored.entries())
    assert len(got) == len(expected)
    assert set(got) == set(expected)
    for k, e in expected.items():
        assert got[k].config == e.config, k
        assert got[k].median_ms == e.median_ms, k
        assert got[k].created == e.created, k
    tuned_ops = {e.key.op for e in expected.values() if e.key.variant == "triton_flat"}
    assert tuned_ops == {"opforge::add", "opforge::mul", "opforge::sub", "opforge::maximum"}


# ---------------------------------------------------------------------------
# OPFORGE_AUTOTUNE
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("value,expected", [("off", "off"), ("on", "on"), ("exhaustive", "exhaustive"),
                                            (" Exhaustive ", "exhaustive"), ("OFF", "off"),
                                            ("cached", "cached"), ("Background", "background")])
def test_mode_reads_env(monkeypatch, value, expected):
    monkeypatch.setenv("OPFORGE_AUTOTUNE", value)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert autotune.mode() == expected


def test_mode_defaults_to_cached(monkeypatch):
    """Issue 23: by default nothing is tuned inside a user's call."""
    monkeypatch.delenv("OPFORGE_AUTOTUNE", raising=False)
    assert autotune.mode() == "cached"


@pytest.mark.parametrize("junk", ["fast", "1", "yes please"])
def test_mode_junk_warns_and_uses_the_default(monkeypatch, junk):
    monkeypatch.setenv("OPFORGE_AUTOTUNE", junk)
    with pytest.warns(RuntimeWarning, match="OPFORGE_AUTOTUNE"):
        assert autotune.mode() == "cached"


# ---------------------------------------------------------------------------
# JSON lines and the shipped table
# ---------------------------------------------------------------------------
def test_entry_json_round_trip():
    e = _entry(4, gpu="NVIDIA H200", sm_count=132)
    line = e.to_json()
    assert "\n" not in line
    back = TuneEntry.from_json(line)
    assert back == e
    assert isinstance(back.key.sm_count, int) and isinstance(back.median_ms, float)
    d = json.loads(line)
    assert d["key"]["sm_count"] == 132 and d["key"]["op"] == "opforge::add"


def test_read_jsonl_skips_blank_lines_and_defaults_created():
    a, b = _entry(1), _entry(2)
    legacy = {"key": dataclasses.asdict(_entry(3).key), "config": {"BLOCK": 256}, "median_ms": 3}
    text = "\n" + a.to_json() + "\n\n   \n" + b.to_json() + "\n" + json.dumps(legacy)  # no final newline
    got = cache.read_jsonl(text)
    assert got[:2] == [a, b]
    assert got[2].key == _entry(3).key
    assert got[2].config == {"BLOCK": 256}
    assert got[2].median_ms == 3.0 and got[2].created == 0.0
    assert cache.read_jsonl("") == [] and cache.read_jsonl("\n\n") == []


def _fake_package(monkeypatch, root: Path):
    monkeypatch.setattr(cache, "resources", SimpleNamespace(files=lambda package: root))


def test_shipped_table_loads_package_jsonl_files(tmp_path, monkeypatch):
    tuned = tmp_path / "tuned"
    tuned.mkdir()
    first = [_entry(i, gpu="NVIDIA H200") for i in range(3)]
    override = TuneEntry(first[1].key, {"BLOCK": 99}, 0.01, created=5.0)
    (tuned / "a_h200.jsonl").write_text("".join(e.to_json() + "\n" for e in first))
    (tuned / "b_h200_more.jsonl").write_text(override.to_json() + "\n")  # later file wins
    (tuned / "README.txt").write_text("not json at all\n")  # ignored: not .jsonl
    _fake_package(monkeypatch, tmp_path)

    table = cache.ShippedTable()
    assert len(table) == 3
    assert table.get(first[0].key) == first[0]
    assert table.get(first[1].key) == override
    assert table.get(BASE_KEY) is None

    # lookup: the user's cache first, then the shipped table
    monkeypatch.setattr(autotune, "shipped", table)
    user = AutotuneCache(tmp_path / "user.sqlite")
    assert autotune.lookup(first[2].key, user) == (first[2], "shipped")
    mine = TuneEntry(first[2].key, {"BLOCK": 7}, 9.0)
    user.put(mine)
    assert autotune.lookup(first[2].key, user) == (mine, "tuned")


def test_shipped_table_without_tuned_folder_is_empty(tmp_path, monkeypatch):
    _fake_package(monkeypatch, tmp_path)  # a package with no tuned/ folder
    table = cache.ShippedTable()
    assert len(table) == 0
    assert table.get(BASE_KEY) is None


def test_package_shipped_entries_are_consistent():
    """Whatever ships in the package parses, and names a registered op and variant."""
    from importlib import resources

    if not (resources.files("opforge.runtime") / "tuned").is_dir():
        pytest.skip("the package ships no tuned/ folder")
    for e in cache.ShippedTable()._load().values():
        op = registry.get(e.key.op)
        v = op.variant(e.key.variant)
        assert e.key.kernel_version, e.key
        assert v.kind != "reference", e.key
        assert e.median_ms > 0 and isinstance(e.config, dict), e.key

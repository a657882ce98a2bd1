"""``opforge warmup``: the shipped manifests cover what the engines launch, the
recorder derives Triton's specializations, entries rebuild into arguments that
specialize the same way (and compile for sm_90 without a GPU), the manifest
file is canonical, and without a GPU the command says so."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from opforge.warmup import manifest, workloads
from opforge.warmup.compile import compile_all, resolve_kernel, stand_ins
from opforge.warmup.launches import LaunchRecorder, Specialization
from warmup_kernels import scale_kernel


def _record(engine: str) -> LaunchRecorder:
    with LaunchRecorder() as rec:
        if engine == "sql":
            workloads.sql("cpu", workloads.CI_SQL_SCALES)
        else:
            workloads.stream("cpu", workloads.CI_STREAM_EVENTS, workloads.CI_STREAM_BATCH)
    return rec


@pytest.mark.parametrize("engine", ["sql", "stream"])
def test_manifest_covers_every_kernel_the_engine_launches(engine, tmp_path, monkeypatch):
    """TPC-H (all 22 queries, SF0.001) and the Nexmark queries, with dispatch's
    own choices (the Triton kernels, under the interpreter) and an empty
    autotune cache, as ``opforge warmup --record`` runs them."""
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(tmp_path))
    rec = _record(engine)
    assert not rec.failures
    assert rec.specializations, f"the {engine} workload launched no Triton kernel"
    missing = manifest.load(engine).missing(rec.specializations.values())
    assert not missing, (
        f"{len(missing)} kernel specialization(s) the {engine} engine launches are not in "
        f"src/opforge/warmup/manifests/{engine}.json; regenerate it with `opforge warmup --record {engine}` "
        f"on a CPU-only machine (and on the GPU, see the README). First missing: "
        + "; ".join(json.dumps(s.to_json()) for s in missing[:3]))


def test_recorder_derives_tritons_argument_classes():
    x = torch.zeros(64)
    with LaunchRecorder() as rec:
        scale_kernel[(1,)](x, x, 64, 2.0, BLOCK=64, COMPUTE=None)         # aligned, n % 16 == 0
        scale_kernel[(1,)](x[1:], x[1:], 17, 2.0, BLOCK=32, COMPUTE=None)  # 4-byte offset, odd n
        scale_kernel[(1,)](x, x, 1, 2.0, BLOCK=64, COMPUTE=None, num_warps=2)  # n == 1 becomes a constant
        scale_kernel[(1,)](x, x, 64, 2.0, BLOCK=64, COMPUTE=None)         # the same specialization again
    got = sorted((json.dumps(s.to_json(), sort_keys=True) for s in rec.specializations.values()))
    name = "warmup_kernels:scale_kernel"
    want = sorted(json.dumps(d, sort_keys=True) for d in [
        {"kernel": name, "signature": {"x_ptr": "*fp32:D", "out_ptr": "*fp32:D", "n": "i32:D", "alpha": "fp32"},
         "constexprs": {"BLOCK": 64, "COMPUTE": None}, "options": {}},
        {"kernel": name, "signature": {"x_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32", "alpha": "fp32"},
         "constexprs": {"BLOCK": 32, "COMPUTE": None}, "options": {}},
        {"kernel": name, "signature": {"x_ptr": "*fp32:D", "out_ptr": "*fp32:D", "n": "1", "alpha": "fp32"},
         "constexprs": {"BLOCK": 64, "COMPUTE": None}, "options": {"num_warps": 2}},
    ])
    assert got == want
    assert rec.launches == 4
    assert torch.equal(x[:17], torch.zeros(17))  # the launches ran (zeros scaled stay zeros)


def test_recorder_keeps_generated_sources_and_they_rebuild():
    from opforge.fusion import fuse

    @fuse(name="warmup_probe")
    def probe(a, b):
        return torch.sigmoid(a) * b + 1.0

    a, b = torch.randn(100), torch.randn(100)
    with LaunchRecorder() as rec:
        out = probe(a, b)
    torch.testing.assert_close(out, torch.sigmoid(a) * b + 1.0)
    generated = [s for s in rec.specializations.values() if s.generated]
    assert generated and set(rec.sources) == {s.module for s in generated}
    for s in generated:
        stand_ins(resolve_kernel(s, rec.sources), s)


@pytest.mark.parametrize("engine", manifest.ENGINES)
def test_every_entry_rebuilds_into_arguments_that_specialize_the_same(engine):
    m = manifest.load(engine)
    for s in m.entries.values():
        args, options = stand_ins(resolve_kernel(s, m.sources), s)  # raises on any difference
        assert len(args) == len(s.signature) + len(s.constexprs)


def test_stand_ins_refuse_an_entry_the_kernel_no_longer_matches():
    s = Specialization("warmup_kernels:scale_kernel", (("x_ptr", "*fp32:D"), ("out_ptr", "*fp32:D"), ("n", "i32")),
                       (("BLOCK", 64), ("COMPUTE", None)), ())
    with pytest.raises(ValueError, match="differ from the entry"):
        stand_ins(scale_kernel, s)


def test_manifest_files_are_canonical_and_round_trip(tmp_path):
    for engine in manifest.ENGINES:
        p = manifest.path(engine)
        if not p.exists():
            continue
        text = p.read_text()
        m = manifest.loads(text, engine)
        assert m.dumps() == text, f"{p} is not in canonical form; rewrite it with manifest.load(...).save()"
    entries = [Specialization("m:k", (("n", f"i{w}"),), (("B", b), ("T", "tl.float32")), (("num_warps", 4),))
               for w in (32, 64) for b in (16, 32, 64)]
    shuffled = entries[:]
    random.Random(0).shuffle(shuffled)
    one, two = manifest.Manifest("ops"), manifest.Manifest("ops")
    one.add(entries, {}, "recipe b")
    one.add(entries[:2], {}, "recipe a")
    two.add(shuffled, {}, "recipe a")
    two.add(shuffled, {}, "recipe b")
    assert one.dumps() == two.dumps()
    one.save(tmp_path)
    back = manifest.load("ops", tmp_path)
    assert sorted(back.entries) == sorted(s.key() for s in entries) and back.recipes == {"recipe a", "recipe b"}
    assert back.missing(entries) == [] and len(back.missing([Specialization("m:k", (), (), ())])) == 1


def test_entries_compile_for_sm90_without_a_gpu(tmp_path, monkeypatch):
    """The compile path itself, in worker processes (kernels compile only with the interpreter off);
    an entry that cannot compile is reported, the others still compile."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]))
    sig = (("x_ptr", "*fp32:D"), ("out_ptr", "*fp32:D"), ("n", "i32"), ("alpha", "fp32"))
    good = Specialization("warmup_kernels:scale_kernel", sig, (("BLOCK", 128), ("COMPUTE", None)), (("num_warps", 4),))
    bad = Specialization("warmup_kernels:scale_kernel", sig, (("BLOCK", 100), ("COMPUTE", None)), ())  # not a power of 2
    results = {r.key: r for r in compile_all([good, bad], {}, jobs=2, arch=90)}
    assert results[good.key()].error == ""
    assert "power of 2" in results[bad.key()].error
    assert sum(p.suffix == ".cubin" for p in tmp_path.rglob("*")) == 1
    _launcher_source_is_the_launch_paths(good, results[good.key()].launcher, monkeypatch)


def _launcher_source_is_the_launch_paths(spec, source, monkeypatch):
    """The launcher source a worker sent back is the one Triton's launch path asks to build for
    the kernel as a fresh process loads it from the cache (``launch_path_probe``: Triton's own
    ``CudaLauncher`` run up to its build call); without a CUDA driver it is counted, not built."""
    from opforge.warmup.compile import _worker_env
    from opforge.warmup.launchers import LAUNCHER_NAME, LauncherBuilder, cached_launcher, driver_missing

    probe = subprocess.run([sys.executable, str(Path(__file__).with_name("launch_path_probe.py")),
                            json.dumps(spec.to_json()), "90"], env=_worker_env(), capture_output=True, text=True)
    assert probe.returncode == 0, probe.stderr[-2000:]
    asked = json.loads(probe.stdout.strip().splitlines()[-1])
    assert asked == {"src": source, "name": LAUNCHER_NAME, "cached": False} and "cuLaunchKernelEx" in source
    builder = LauncherBuilder(jobs=2)
    builder.add(source)
    builder.add(source)
    report = builder.finish()
    assert report.distinct == 1
    if driver_missing():  # this machine: counted, nothing written (a module that could not load)
        assert report.skipped and report.built == 0 and cached_launcher(source) is None
    else:  # a CUDA machine: built where the launch path looks first
        assert report.built == 1 and not report.errors and cached_launcher(source) is not None


def test_warmup_without_a_gpu_says_so(capsys, monkeypatch):
    from opforge import cli

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cli.main(["warmup"]) == 1
    err = capsys.readouterr().err
    assert "no CUDA GPU here" in err and "--arch 90" in err

"""The command line and the bench harness, on the CPU (kernels under the interpreter)."""

import io
import json
import math

import pytest
import torch
from rich.console import Console

from opforge import cli
from opforge.runtime import jit, roofline
from opforge.runtime.cache import autotune_cache, read_jsonl

DESIGN_ENTRY_FIELDS = {"op", "variant", "shape", "dtype", "flops", "bytes", "median_ms", "tbps", "tflops",
                       "pct_roofline", "max_rel_err", "peers"}


def test_doctor_reports_versions_and_cache(capsys):
    assert cli.main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert torch.__version__ in out
    assert "autotune.sqlite" in out
    assert "interpreter" in out  # OPFORGE_INTERPRET=1 in the test session


def test_bench_quick_writes_design_json_and_png(tmp_path):
    js, png = tmp_path / "r.json", tmp_path / "r.png"
    # a memory-bound and a compute-bound family (every family's quick cases: tests/bench/test_families.py)
    code = cli.main(["bench", "--quick", "--family", "softmax", "--family", "transpose", "--family", "grouped_gemm",
                     "--no-crossover", "--no-host", "--json", str(js), "--plot", str(png)])
    assert code == 0  # every entry passed its correctness check
    r = json.loads(js.read_text())
    for field in ("schema_version", "date", "gpu", "driver", "torch", "triton", "ceilings", "entries"):
        assert field in r
    assert r["cpu_figures"] is True
    assert r["ceilings"]["copy_tbps"] > 0 and r["ceilings"]["bf16_tflops"] > 0
    assert r["entries"]
    for e in r["entries"]:
        assert DESIGN_ENTRY_FIELDS <= set(e)
        assert e["variant"].startswith("triton_")  # the interpreter ran our kernels, not the reference
        assert e["correct"] and e["max_rel_err"] < 1e-2
        assert math.isclose(e["tbps"], e["bytes"] / (e["median_ms"] * 1e-3) / 1e12, rel_tol=1e-9)
        assert all(p["ratio"] > 0 for p in e["peers"].values())
    # the memory-bound families compare with torch eager even on CPU
    assert sum("torch eager" in e["peers"] for e in r["entries"]) >= len(r["entries"]) // 2
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_tune_cli_stores_exports_and_imports(tmp_path, monkeypatch):
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "tuned.jsonl"
    assert cli.main(["tune", "--op", "add", "--shape", "96", "--shape", "40x3", "--dtype", "fp32",
                     "--mode", "on", "--export", str(out)]) == 0
    entries = read_jsonl(out.read_text())
    assert {e.key.shape_bucket for e in entries} == {"128"}  # both shapes are dense: triton_flat, bucket 128
    assert all(e.key.op == "opforge::add" and e.key.variant == "triton_flat" for e in entries)
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(tmp_path / "other"))
    assert cli.main(["tune", "--import", str(out)]) == 0
    assert [e.key for e in autotune_cache().entries()] == [e.key for e in entries]


def test_warmup_reports_one_compile_per_candidate(gen):
    x = torch.randn(33, 7, generator=gen)
    reports = jit.warmup("gelu", x, None, all_configs=True, parallel=False)
    variants = {r.variant for r in reports}
    assert variants == {"triton_flat", "triton_strided"}
    assert all(r.seconds > 0 and not r.error for r in reports)
    chosen = jit.warmup("gelu", x, None)
    assert len(chosen) == 1 and chosen[0].variant == "triton_flat"


@pytest.mark.parametrize("flops,nbytes,expect_ms", [(0, 4e12, 1000.0), (2e15, 0, 1000.0), (2e12, 4e9, 1.0)])
def test_roofline_floor_is_the_larger_of_memory_and_math(flops, nbytes, expect_ms):
    c = roofline.Ceilings(copy_tbps=4.0, bf16_tflops=2000.0, measured_on="", method="")
    assert c.floor_ms(flops, nbytes) == pytest.approx(expect_ms)
    assert c.ridge == pytest.approx(500.0)
    assert c.attainable_tflops(1.0) == pytest.approx(4.0)
    assert c.attainable_tflops(1e4) == pytest.approx(2000.0)


def test_selftest_passes_real_variants_and_catches_a_wrong_one():
    import dataclasses

    from opforge import selftest
    from opforge.runtime import registry

    op = registry.get("mul")
    good = selftest.check_variant(op, op.variant("triton_strided"), torch.device("cpu"))
    assert good.passed > 0 and good.failed == 0
    strided = op.variant("triton_strided")
    off_by_one = dataclasses.replace(strided, run=lambda cfg, a, b=None: strided.run(cfg, a, b) + 1)
    bad = selftest.check_variant(op, off_by_one, torch.device("cpu"))
    assert bad.failed == good.passed and bad.passed == 0


def test_selftest_bound_allows_for_tf32_and_fp8_tensor_cores_only():
    from opforge import selftest
    from opforge.ops.matmul import Epilogue

    x32 = torch.ones(2, 2)
    assert selftest.bound(torch.float32, (x32, x32)) == 1e-5
    assert selftest.bound(torch.float32, (x32, x32, Epilogue(tf32=False))) == 1e-5
    assert selftest.bound(torch.float32, (x32, x32, Epilogue(tf32=True))) == selftest.TF32_REL_ERR_BOUND
    f8 = x32.to(torch.float8_e4m3fn)
    assert selftest.bound(torch.float32, (f8, f8)) == selftest.FP8_REL_ERR_BOUND
    assert selftest.bound(torch.bfloat16, (f8, f8)) == 1e-2  # the output's rounding dominates


def test_tune_bench_preset_tunes_the_grid_of_a_family(tmp_path, monkeypatch):
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(tmp_path / "cache"))
    from opforge.bench import softmax as softmax_bench
    from opforge.tune import bench_jobs

    jobs = bench_jobs(True, ["softmax"])
    labels = {(j.op, j.label) for j in jobs}
    assert len(labels) == len(jobs)  # each op, shape and dtype once
    assert len(jobs) >= len(softmax_bench.cases(torch.device("cpu"), True))
    out = tmp_path / "tuned.jsonl"
    assert cli.main(["tune", "--preset", "bench", "--quick", "--family", "softmax", "--mode", "on",
                     "--budget", "60", "--export", str(out)]) == 0
    entries = read_jsonl(out.read_text())
    assert {e.key.op for e in entries} == {"opforge::softmax", "opforge::log_softmax"}
    assert all(e.key.variant.startswith("triton_") for e in entries)


def test_selftest_selects_ops_by_name_and_prefix(capsys):
    from opforge import selftest

    names = [op.name for op in selftest.select(["opforge::cumsum", "cross_entropy*"])]
    assert names[0] == "cumsum" and set(names[1:]) == {"cross_entropy_forward", "cross_entropy_backward",
                                                       "cross_entropy_fused"}
    with pytest.raises(ValueError, match="no op matches"):
        selftest.select(["no_such_op"])
    # with --jobs the parent refuses it once, before starting a shard process
    with pytest.raises(ValueError, match="no op matches"):
        selftest.run(ops=["moe*"], jobs=4, console=Console(file=io.StringIO()))
    assert cli.main(["selftest", "--op", "neg"]) == 0
    out = capsys.readouterr().out
    assert "opforge::neg" in out and "opforge::exp" not in out and " 0 failed" in out


def test_selftest_shards_partition_the_variants_and_jobs_merge_them(tmp_path, capsys):
    from opforge import selftest

    every = [(op.name, v.name) for op, v in selftest.variants(["cumsum", "neg"])]
    shards = [[(op.name, v.name) for op, v in selftest.variants(["cumsum", "neg"], (k, 3))] for k in range(3)]
    assert sorted(sum(shards, [])) == sorted(every) and all(shards)
    with pytest.raises(ValueError, match="shard 3/3"):
        selftest.variants(None, (3, 3))
    out = tmp_path / "r.json"
    assert cli.main(["selftest", "--op", "neg", "--jobs", "2", "--json", str(out)]) == 0
    merged = {(r["op"], r["variant"]) for r in json.loads(out.read_text())}
    assert merged == {("opforge::" + op, v) for op, v in every if op == "neg"}
    assert " 0 failed" in capsys.readouterr().out


def test_profile_cli_reports_compiled_resources(tmp_path, capsys):
    out = tmp_path / "p.json"
    assert cli.main(["profile", "softmax", "--shape", "64x256", "--dtype", "fp32", "--arg", "-1",
                     "--no-sweep", "--json", str(out)]) == 0
    (chosen,) = [row for row in json.loads(out.read_text())["rows"] if row["chosen"]]
    (report,) = chosen["kernels"]
    assert report["kernel"].endswith(":row_forward_kernel") and report["registers"] > 0
    occ = report["occupancy"]
    assert occ["blocks_per_sm"] == min(occ["limits"].values())
    assert "opforge::softmax" in capsys.readouterr().out

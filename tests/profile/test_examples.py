"""The examples' ladders run correctly under the interpreter (tiny sizes), and
their reports are complete; compiled resources are covered by the sweep tests."""

import os
import sys

import pytest

from opforge.profile import report as R

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples")


@pytest.fixture(scope="module")
def examples():
    sys.path.insert(0, os.path.abspath(EXAMPLES))
    try:
        import gemm_ladder
        import reduction_ladder
        import transpose_ladder

        yield transpose_ladder, reduction_ladder, gemm_ladder
    finally:
        sys.path.remove(os.path.abspath(EXAMPLES))


def test_transpose_ladder_on_cpu(examples, tmp_path):
    transpose = examples[0]
    rep = transpose.run(str(tmp_path), size=40, device="cpu", resources=False)
    assert [r["label"] for r in rep["rows"]] == ["naive", "tiled 32x32", "tiled 64x64"]
    assert all(r["correct"] for r in rep["rows"]), rep["max_rel_err"]
    assert max(rep["max_rel_err"].values()) == 0.0  # a transpose moves values exactly
    R.validate(rep)
    for ext in ("json", "html", "png"):
        assert (tmp_path / f"transpose_ladder.{ext}").stat().st_size > 1000


def test_reduction_ladder_on_cpu(examples):
    reduction = examples[1]
    rep = reduction.run(None, size=3000, device="cpu", resources=False)
    assert [r["label"] for r in rep["rows"]] == ["atomic", "interleaved", "sequential", "block tl.sum", "two-pass"]
    assert all(r["correct"] for r in rep["rows"]), rep["max_rel_err"]
    assert all(e == 0.0 for e in rep["max_rel_err"].values())  # 0/1 data: every order of additions is exact


def test_a_wrong_kernel_is_caught(examples, monkeypatch):
    # the check can fail: a step whose output is off is marked wrong
    reduction = examples[1]
    real = reduction.build_block

    def off_by_one(device, n, **kw):
        b = real(device, n, **kw)
        run = b.run
        b.run = lambda: (run(), b.output().add_(1.0))
        return b

    monkeypatch.setattr(reduction, "build_block", off_by_one)
    rep = reduction.run(None, size=1000, device="cpu", resources=False)
    assert [r["label"] for r in rep["rows"] if not r["correct"]] == ["block tl.sum"]


def test_gemm_ladder_on_cpu(examples):
    """Every rung (fp32 on the CUDA cores, fp16 on tensor cores) gives A @ B of the
    same fp16-valued matrices, on odd sizes that no tile divides."""
    gemm = examples[2]
    rep = gemm.run(None, size=24, device="cpu", resources=False)
    assert [r["label"] for r in rep["rows"]] == ["naive", "tiled 16x16", "register tiled 64x64", "tensor cores"]
    assert all(r["correct"] for r in rep["rows"]), rep["max_rel_err"]
    assert max(rep["max_rel_err"].values()) < 1e-5
    R.validate(rep)

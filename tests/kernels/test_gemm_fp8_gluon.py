"""The Gluon FP8 GEMM on a CPU machine: its dispatch rules (opt-in, what it
refuses and why), the CPU path of scaled_matmul beside it, the config's fit in
shared memory, and that the warp-specialized kernel compiles for sm_90 into
the Hopper instructions it is built on (QGMMA, UTMALDG / UTMASTG, mbarrier
SYNCS, setmaxnreg) without spilling. Gluon does not run under the
interpreter; the device check is benchmarks/gluon_fp8_gemm.py.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from opforge.kernels import gemm_fp8_gluon as G
from opforge.ops import scaled_matmul as S
from opforge.ops import scaled_matmul_gluon as SG
from opforge.runtime import dispatch, registry

E4M3, BF16, F32 = torch.float8_e4m3fn, torch.bfloat16, torch.float32


def _geometry(**kw):
    g = S.Geometry(M=4096, N=4096, K=4096, modes=(S.TENSOR, S.TENSOR), a_dtype=E4M3, b_dtype=E4M3, out_dtype=BF16,
                   fast_accum=False, sms=132, tma=True)
    return replace(g, **kw)


@pytest.fixture
def on_device(monkeypatch):
    """check() as it runs on the H200: not the interpreter."""
    monkeypatch.setattr(SG.devmod, "interpret_mode", lambda: False)
    monkeypatch.delenv("OPFORGE_GLUON", raising=False)


def test_gluon_variant_is_first_on_for_block_scales_opt_in_for_the_others(on_device, monkeypatch):
    names = [v.name for v in registry.get("scaled_matmul").variants]
    assert names[0] == SG.NAME and names[-1] == "reference"
    assert SG.check(_geometry(modes=(S.BLOCK, S.BLOCK))) is None
    assert SG.check(_geometry(modes=(S.ROW, S.BLOCK))) is None
    assert SG.check(_geometry(modes=(S.BLOCK, S.BLOCK), b_dtype=torch.float8_e5m2)) is None
    monkeypatch.setattr(SG, "BLOCK_SCALES_BY_DEFAULT", False)
    assert "OPFORGE_GLUON=1" in SG.check(_geometry(modes=(S.BLOCK, S.BLOCK)))
    g = _geometry(modes=(S.ROW, S.ROW))
    assert "OPFORGE_GLUON=1" in SG.check(g)
    monkeypatch.setenv("OPFORGE_GLUON", "1")
    assert SG.check(g) is None
    monkeypatch.setenv("OPFORGE_GLUON", "0")
    with dispatch.force_variant("scaled_matmul", SG.NAME):
        assert SG.check(g) is None


@pytest.mark.parametrize("change, words", [
    ({"a_dtype": torch.int8, "b_dtype": torch.int8}, "fp8 operands only"),
    ({"tma": False}, "K-major"),
    ({"N": 4100}, "16-byte aligned"),
    ({"M": 64}, "split-K"),
    ({"modes": (S.BLOCK, S.BLOCK), "fast_accum": True}, "no fast-accumulation"),
])
def test_gluon_variant_refusals(on_device, monkeypatch, change, words):
    monkeypatch.setenv("OPFORGE_GLUON", "1")
    assert words in SG.check(_geometry(**change))


def test_interpreter_refuses_gluon_and_cpu_runs_the_reference(gen):
    a = (torch.randn(96, 256, generator=gen) * 2).to(E4M3)
    w = (torch.randn(80, 256, generator=gen) * 2).to(E4M3)
    sa, sb = torch.rand(96, 2, generator=gen) + 0.5, torch.rand(2, 1, generator=gen) + 0.5
    d = dispatch.decide(registry.get("scaled_matmul"), (a, w.t(), sa, sb, None, S.ScaledEpilogue(out_dtype=F32)))
    assert "interpreter" in d.rejected[SG.NAME] or "CPU" in d.rejected[SG.NAME]
    with dispatch.force_variant("scaled_matmul", "reference"):
        out = S.scaled_matmul(a, w.t(), sa, sb, out_dtype=F32)
    ea = sa.repeat_interleave(128, 1)
    eb = sb.repeat_interleave(128, 0).repeat_interleave(128, 1)[:, :80]
    want = (a.double() * ea.double()) @ (w.double().t() * eb.double())
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fast, out_bytes", [(False, 2), (False, 4), (True, 2), (True, 4)])
def test_default_config_fits_shared_memory(fast, out_bytes):
    cfg = G.default_config(8192, 8192, 8192, "ws", fast, out_bytes)
    assert cfg["BLOCK_N"] == 256 and G.default_config(8192, 8192, 8192, block=True)["BLOCK_N"] == 128
    # the ring, and one [64, 128] output tile per consumer warpgroup
    smem = cfg["STAGES"] * (cfg["BLOCK_M"] + cfg["BLOCK_N"]) * G.BLOCK_K + cfg["BLOCK_M"] * G.HALF_N * out_bytes
    assert cfg["STAGES"] >= 3 and smem <= G.SMEM_BYTES


def _cuobjdump() -> str:
    import triton.backends.nvidia as nv

    tool = Path(nv.__file__).parent / "bin" / "cuobjdump"
    if not tool.exists():
        pytest.skip("triton's bundled cuobjdump is missing")
    return str(tool)


@pytest.mark.fresh_process
def test_ws_kernel_compiles_for_sm90_with_hopper_instructions():
    """Block scales on both sides: the promotion path, the scale loads in the loop and the epilogue."""
    tool = _cuobjdump()
    k = G.compile_sm90("ws", modes=(G.BLOCK, G.BLOCK), bias=True)
    with tempfile.TemporaryDirectory() as d:
        cubin = Path(d) / "k.cubin"
        cubin.write_bytes(k.asm["cubin"])
        sass = subprocess.run([tool, "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout
        res = subprocess.run([tool, "-res-usage", str(cubin)], capture_output=True, text=True, check=True).stdout
    for ins in ("QGMMA", "UTMALDG", "UTMASTG", "SYNCS", "USETMAXREG"):
        assert re.search(rf"\b{ins}\b", sass), f"{ins} missing from the SASS"
    assert re.search(r"\bLOCAL:0\b", res) and re.search(r"\bSTACK:0\b", res), f"the kernel spills: {res}"
    maxnreg = {int(v, 16) for v in re.findall(r"USETMAXREG\.\S+ (?:UP0, )?0x([0-9a-f]+)", sass)}
    assert {40, 232} <= maxnreg  # the producer's and the consumers' budgets

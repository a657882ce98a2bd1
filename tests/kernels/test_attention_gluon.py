"""The ``gluon_ws`` attention forward (kernels/attention_gluon.py): which calls
dispatch may give it, and that it compiles for sm_90 into wgmma, TMA, mbarrier
and setmaxnreg instructions without spilling. Gluon has no interpreter: its
numerics are checked on the GPU (benchmarks/gluon_attention.py, ``opforge
selftest``)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from opforge.ops import attention as A
from opforge.ops import attention_gluon as AG
from opforge.runtime import dispatch, registry

BF16 = torch.bfloat16


def _geometry(H=4, Hk=4, Sq=96, Sk=96, D=128, dtype=BF16, left=-1, right=0, varlen=False):
    if varlen:
        q, k = torch.ones(Sq, H, D, dtype=dtype), torch.ones(Sk, Hk, D, dtype=dtype)
        cu = torch.tensor([0, Sq], dtype=torch.int32)
        return A.forward_geometry(q, k, k, D ** -0.5, left, right, cu, cu, Sq, Sk)
    q, k = torch.ones(1, H, Sq, D, dtype=dtype), torch.ones(1, Hk, Sk, D, dtype=dtype)
    return A.forward_geometry(q, k, k, D ** -0.5, left, right, None, None, -1, -1)


@pytest.fixture
def on_hopper(monkeypatch):
    """What the check sees on an H200 with the guard open."""
    monkeypatch.setattr(AG, "interpret_mode", lambda: False)
    monkeypatch.setattr(AG, "_hopper", lambda: True)
    monkeypatch.setenv("OPFORGE_GLUON", "1")


@pytest.mark.parametrize("geom,reason", [
    (dict(), None),
    (dict(right=-1, Sq=300, Sk=200), None),  # full attention, Sq != Sk
    (dict(H=8, Hk=2, D=64), None),  # GQA
    (dict(dtype=torch.float32), "fp16/bf16"),
    (dict(D=32), "head dims"),
    (dict(left=8), "windows"),
    (dict(Sq=300, Sk=200), "Sq > Sk"),
    (dict(varlen=True), "varlen"),
    (dict(Sk=0, right=-1), "empty"),
], ids=["causal", "full-ragged", "gqa-d64", "fp32", "d32", "window", "causal-keyless", "varlen", "empty"])
def test_check_takes_only_what_the_kernel_handles(on_hopper, geom, reason):
    got = AG.check(_geometry(**geom))
    assert got == reason if reason is None else reason in got


def test_guard_gpu_and_interpreter_rules(on_hopper, monkeypatch):
    g = _geometry()
    assert AG.check(g) is None and AG.backward_check(g) is None
    assert "varlen" in AG.backward_check(_geometry(varlen=True))
    monkeypatch.setenv("OPFORGE_GLUON", "0")
    assert "OPFORGE_GLUON=1" in AG.check(g) and "OPFORGE_GLUON=1" in AG.backward_check(g)
    monkeypatch.delenv("OPFORGE_GLUON")
    assert ("OPFORGE_GLUON=1" in (AG.check(g) or "")) is not AG.ENABLED_BY_DEFAULT
    assert ("OPFORGE_GLUON=1" in (AG.backward_check(g) or "")) is not AG.BACKWARD_ENABLED_BY_DEFAULT
    monkeypatch.setattr(AG, "_hopper", lambda: False)
    assert "sm_90" in AG.check(g)
    monkeypatch.setattr(AG, "interpret_mode", lambda: True)
    assert "interpreter" in AG.check(g)


def test_dispatch_order_and_cpu_fallback(monkeypatch):
    monkeypatch.setenv("OPFORGE_GLUON", "1")
    op = registry.get("attention")
    assert [v.name for v in op.variants][:2] == ["gluon_ws", "triton_flash_tma"]
    assert [v.name for v in registry.get("attention_backward").variants][:2] == ["gluon_ws", "triton_flash_tma"]
    assert op.variant("gluon_ws").min_capability == (9, 0)
    q = torch.randn(1, 2, 40, 64, dtype=torch.float16)
    d = dispatch.explain("attention", q, q, q, 0.125, -1, 0, None, None, -1, -1)
    assert d.variant.name != "gluon_ws" and "interpreter" in d.rejected["gluon_ws"]


def _cuobjdump() -> str:
    import triton.backends.nvidia as nv

    return str(Path(nv.__file__).parent / "bin" / "cuobjdump")


_COMPILE = """
import sys
from pathlib import Path
from opforge.kernels import attention_gluon as KG
k = KG.compile_sm90(D=128, causal=True)
Path(sys.argv[1], "attn.cubin").write_bytes(k.asm["cubin"])
Path(sys.argv[1], "attn.ptx").write_text(k.asm["ptx"])
"""


def test_compiles_for_sm90_to_wgmma_tma_mbarriers_and_setmaxnreg(tmp_path):
    # A child process: Gluon's standard functions (gl.max, gl.zeros...) are Triton jit functions,
    # which TRITON_INTERPRET=1 (this suite's setting) turns into interpreter objects Gluon cannot compile.
    src = str(Path(A.__file__).parents[2])
    env = dict(os.environ, TRITON_INTERPRET="0", OPFORGE_INTERPRET="0",
               PYTHONPATH=os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")])))
    subprocess.run([sys.executable, "-c", _COMPILE, str(tmp_path)], env=env, check=True, timeout=300)
    cubin = tmp_path / "attn.cubin"
    sass = subprocess.run([_cuobjdump(), "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout
    counts = {ins: len(re.findall(rf"\b{ins}\b", sass)) for ins in ("HGMMA", "UTMALDG", "UTMASTG", "USETMAXREG")}
    # QK^T and PV are 8 wgmma k-steps each at D = BLOCK_N = 128, each issued in two places (loop and edges).
    assert counts["HGMMA"] >= 16, counts
    assert counts["UTMALDG"] and counts["UTMASTG"] and counts["USETMAXREG"], counts
    assert re.search(r"\bSYNCS\.", sass), "no mbarrier (SYNCS) instructions"
    usage = subprocess.run([_cuobjdump(), "-res-usage", str(cubin)], capture_output=True, text=True,
                           check=True).stdout
    assert "LOCAL:0" in usage, usage  # no spills
    ptx = (tmp_path / "attn.ptx").read_text()
    assert re.search(r"setmaxnreg\.dec\.sync\.aligned\.u32\s+24;", ptx)  # the loader's register budget


def test_shipped_entries_name_configs_the_kernel_has():
    """runtime/tuned/h200-attention-gluon.jsonl holds device-run measurements of configs of this kernel."""
    import json

    from opforge.kernels import attention_gluon as KG

    path = Path(A.__file__).parents[1] / "runtime" / "tuned" / "h200-attention-gluon.jsonl"
    entries = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    assert entries
    for e in entries:
        key = e["key"]
        assert (key["op"], key["variant"], key["kernel_version"]) == ("opforge::attention", "gluon_ws", "1")
        heads, seqs, d, g, mask = re.fullmatch(r"(\d+)h:(\d+)x\d+:d(\d+):g(\d+):(full|causal)",
                                               key["shape_bucket"]).groups()
        assert e["config"] in KG.forward_configs(int(d), int(seqs), int(seqs), mask == "causal", int(g))
        assert e["median_ms"] > 0


def test_backward_delta_is_rowsum_of_do_times_o():
    """The Gluon backward's delta (the Triton delta kernel, under the interpreter) against torch in fp64,
    on a strided view of O as the op passes it (stride(-1) == 1, not contiguous)."""
    from opforge.kernels.attention_gluon_backward import row_delta

    g = torch.Generator().manual_seed(3)
    out = torch.randn(2, 5, 3, 37, 64, generator=g).to(torch.bfloat16)[:, :, 1].transpose(1, 2)
    out = out.transpose(1, 2)  # (2, 5, 37, 64), a view with stride(-1) == 1
    do = torch.randn(2, 5, 37, 64, generator=g).to(torch.bfloat16)
    ref = (do.double() * out.double()).sum(-1)
    got = row_delta(do, out)
    assert got.dtype == torch.float32 and got.shape == (2, 5, 37)
    torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-5)

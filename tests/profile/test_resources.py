"""Compiled resources through a compile child (TRITON_INTERPRET=0), without a GPU."""

import pytest
import torch

import kernels_for_test as K
from opforge.profile import ProfileError, compile_resources, op_resources, parse_ptxas, theoretical_occupancy
from opforge.profile import resources as R
from ptxas_mark import needs_ptxas


def test_parse_ptxas():
    text = ("ptxas info    : Compiling entry function 'k' for 'sm_90a'\n"
            "ptxas info    : Function properties for k\n"
            "    24 bytes stack frame, 16 bytes spill stores, 8 bytes spill loads\n"
            "ptxas info    : Used 255 registers, used 1 barriers, 528 bytes smem\n")
    assert parse_ptxas(text) == {"registers": 255, "spill_stores": 16, "spill_loads": 8}
    with pytest.raises(ProfileError, match="registers"):
        parse_ptxas("nothing here")


def test_missing_ptxas_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("TRITON_PTXAS_PATH", "/nonexistent/ptxas")
    with pytest.raises(ProfileError, match="TRITON_PTXAS_PATH"):
        compile_resources(K.scale_kernel, {"x_ptr": "*fp32", "y_ptr": "*fp32", "n": "i32", "alpha": "fp32"},
                          {"BLOCK": 1024})


def test_kernel_names():
    assert R.kernel_name(K.scale_kernel) == "kernels_for_test:scale_kernel"
    assert R.kernel_name("a.b:c") == "a.b:c"
    with pytest.raises(ValueError):
        R.kernel_name("no_colon")
    with pytest.raises(TypeError):
        R.kernel_name(42)


@needs_ptxas
def test_small_kernel_and_bad_signature():
    sig = {"x_ptr": "*fp32", "y_ptr": "*fp32", "n": "i32", "alpha": "fp32"}
    r = compile_resources(K.scale_kernel, sig, {"BLOCK": 1024}, num_warps=4)
    assert r.registers > 0 and r.shared_bytes >= 0 and r.spill_stores == 0
    assert (r.num_warps, r.kernel) == (4, "kernels_for_test:scale_kernel")
    assert r.occupancy == theoretical_occupancy(r.registers, r.shared_bytes, 4)
    assert r.to_dict()["occupancy"]["limiter"] in ("warps", "registers", "blocks", "shared memory")
    with pytest.raises(ProfileError, match="alpha"):
        compile_resources("kernels_for_test:scale_kernel", {"x_ptr": "*fp32", "y_ptr": "*fp32", "n": "i32"},
                          {"BLOCK": 1024})


@needs_ptxas
def test_huge_tile_spills_or_caps_registers():
    r = compile_resources("kernels_for_test:hog_kernel", {"x_ptr": "*fp32", "y_ptr": "*fp32"},
                          {"BLOCK": 16384}, num_warps=1)
    assert r.spill_stores > 0 or r.registers == 255
    assert r.occupancy.limiter in ("registers", "blocks")


@needs_ptxas
def test_op_resources_softmax_meta_tensors():
    x = torch.empty(64, 1024, dtype=torch.bfloat16, device="meta")
    decision, res = op_resources("softmax", x, -1)
    assert decision.variant.name.startswith("triton_")
    assert len(res) >= 1
    r = res[0]
    assert r.kernel.startswith("opforge.kernels.softmax:")
    assert r.signature["x_ptr"] == "*bf16"
    assert r.registers > 0
    assert r.num_warps == decision.config.get("num_warps", 4)


@needs_ptxas
def test_op_resources_vendor_only_is_an_error():
    x = torch.empty(8, 8)
    with pytest.raises(ProfileError, match="no Triton kernel"):
        op_resources("softmax", x, -1, variant="reference")




@needs_ptxas
def test_op_resources_forced_split_variant_is_json_ready():
    # the split variant is rejected under the interpreter (its programs wait for
    # each other) but compiles fine: variant= picks it
    import json

    x = torch.empty(8, 65536, dtype=torch.bfloat16, device="meta")
    decision, res = op_resources("softmax", x, -1, variant="triton_split")
    assert decision.variant.name == "triton_split" and decision.source == "forced"
    assert [r.kernel for r in res] == ["opforge.kernels.softmax:split_forward_kernel"]
    assert res[0].signature["m_ptr"] == "*fp32"
    json.dumps([r.to_dict() for r in res])


@needs_ptxas
def test_unknown_op_and_variant():
    with pytest.raises(KeyError):
        op_resources("no_such_op", torch.empty(2))
    with pytest.raises((KeyError, ValueError)):
        op_resources("softmax", torch.empty(2, 2), -1, variant="no_such_variant")


def test_tensors_travel_to_the_compile_child_with_their_values_fp8_included():
    import pickle

    import torch

    from opforge.profile import resources as R

    for t in (torch.arange(12, dtype=torch.float32).view(3, 4).t(),
              torch.randn(5, 7).to(torch.float8_e4m3fn).t(), torch.randn(3).to(torch.float8_e5m2)):
        back = R._materialize(pickle.loads(pickle.dumps(R._tensor_spec(t))))
        assert back.dtype == t.dtype and back.shape == t.shape and back.stride() == t.stride()
        assert torch.equal(back.view(torch.uint8) if t.element_size() == 1 else back,
                           t.view(torch.uint8) if t.element_size() == 1 else t)

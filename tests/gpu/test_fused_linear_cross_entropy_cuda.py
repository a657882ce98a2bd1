"""The fused linear cross-entropy's cuBLAS chunk GEMMs (16-bit inputs on CUDA:
``mm`` / ``addmm`` with an fp32 ``out_dtype``, d weight added in place) against
float64 torch. Skipped without CUDA; run on the lent H200 with
``OPFORGE_INTERPRET=0 python3 -m pytest tests/gpu``."""

import os

import pytest
import torch
import torch.nn.functional as F

import opforge
from opforge.ops import fused_linear_cross_entropy as flce
from opforge.runtime.dispatch import force_variant

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or os.environ.get("OPFORGE_INTERPRET") == "1",
    reason="needs a CUDA device (and OPFORGE_INTERPRET=0)",
)


def _rel(a, b):
    return float((a.double() - b).norm() / b.norm())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("with_bias", [False, True])
def test_vendor_chunks_match_fp64(dtype, with_bias):
    g = torch.Generator(device="cpu").manual_seed(7)
    rows, hidden, vocab = 1000, 256, 5003  # ragged last chunk, vocabulary not a multiple of a tile
    h = torch.randn((rows, hidden), generator=g).to(dtype).cuda()
    w = (torch.randn((vocab, hidden), generator=g) / 8).to(dtype).cuda()
    b = torch.randn(vocab, generator=g).to(dtype).cuda() if with_bias else None
    t = torch.randint(0, vocab, (rows,), generator=g).cuda()
    t[:37] = -100
    assert flce.vendor_gemms(h)
    params = [x.clone().requires_grad_() for x in (h, w, b) if x is not None]
    with force_variant("fused_linear_cross_entropy", "chunked"):
        loss = opforge.fused_linear_cross_entropy(params[0], params[1], t, bias=params[2] if with_bias else None,
                                                  chunk_rows=128)
    loss.backward()
    ref_params = [x.double().requires_grad_() for x in (h, w, b) if x is not None]
    ref = F.cross_entropy(F.linear(ref_params[0], ref_params[1], ref_params[2] if with_bias else None), t)
    ref.backward()
    assert abs(loss.item() - ref.item()) < 1e-5 * abs(ref.item())
    for got, want in zip(params, ref_params):
        assert _rel(got.grad, want.grad) < 1e-2  # the 16-bit logits gradient into 16-bit GEMMs

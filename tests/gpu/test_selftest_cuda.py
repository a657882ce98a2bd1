"""The selftest's findings on the H200, kept: torch's own bf16/fp16 cumsum and
cumprod on CUDA lose the small terms, so our ``torch_eager`` scan variants
compute in fp32 and round once. Skipped without CUDA; run on the lent H200 with
``OPFORGE_INTERPRET=0 python3 -m pytest tests/gpu/test_selftest_cuda.py``."""

import os

import pytest
import torch

from opforge import selftest
from opforge.runtime import registry

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or os.environ.get("OPFORGE_INTERPRET") == "1",
    reason="needs a CUDA device (and OPFORGE_INTERPRET=0)",
)


@pytest.mark.parametrize("op", ["cumsum", "cumprod"])
def test_eager_scan_variant_is_within_the_dtype_bound(op):
    spec = registry.get(op)
    r = selftest.check_variant(spec, spec.variant("torch_eager"), torch.device("cuda"))
    assert r.failed == 0 and r.passed > 0, r.failures

"""Tests run on the CPU: Triton kernels under the interpreter, tuning off,
and the autotune cache in a throw-away folder."""

import os
import tempfile

os.environ.setdefault("OPFORGE_INTERPRET", "1")
os.environ["TRITON_INTERPRET"] = "1" if os.environ["OPFORGE_INTERPRET"] == "1" else "0"
os.environ.setdefault("OPFORGE_AUTOTUNE", "off")
os.environ.setdefault("OPFORGE_CACHE_DIR", tempfile.mkdtemp(prefix="opforge-test-cache-"))

import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh_dispatch():
    """Each test starts with no memoized dispatch decisions."""
    from opforge.runtime import dispatch

    dispatch.reset()
    yield
    dispatch.reset()


@pytest.fixture
def gen():
    """A seeded generator: random inputs, never zeros."""
    return torch.Generator().manual_seed(1234)

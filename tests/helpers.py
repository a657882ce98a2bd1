"""What the op and kernel test files share (importable as ``helpers``: pytest
puts ``tests/`` on ``sys.path`` for ``tests/conftest.py``).

``rand`` draws in float64 and rounds once, so every dtype of a test sees the
same values; the warning marks are the noise of running kernels under the
Triton interpreter and of torch.compile / opcheck (torch.jit's deprecated
``script_method``).
"""

from __future__ import annotations

import pytest
import torch

INTERPRETER_WARNINGS = [
    pytest.mark.filterwarnings("ignore::RuntimeWarning"),  # masked lanes: log2(0), -inf - -inf
    pytest.mark.filterwarnings("ignore:Conversion of an array:DeprecationWarning"),
]
API_WARNINGS = INTERPRETER_WARNINGS + [pytest.mark.filterwarnings("ignore:.*script_method.*:DeprecationWarning")]


def rand(shape, gen, dtype=torch.float32, scale=1.0):
    """Normal values times ``scale`` in ``dtype``, from the seeded ``gen``."""
    return (torch.randn(shape, generator=gen, dtype=torch.float64) * scale).to(dtype)

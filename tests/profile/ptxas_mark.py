"""``needs_ptxas``: skips a profile test that compiles for sm_90 where Triton's ptxas is missing."""

import pytest

from opforge.profile import ProfileError, ptxas_path

try:
    ptxas_path()
    HAVE_PTXAS = True
except ProfileError:
    HAVE_PTXAS = False
needs_ptxas = pytest.mark.skipif(not HAVE_PTXAS, reason="Triton's ptxas is not available")

"""Stream tests run ``segment_reduce`` (the windows' GPU fold) through its
plain-torch reference: the Triton interpreter takes far longer per call. One
test marked ``triton_kernels`` keeps dispatch's own choice."""
import contextlib

import pytest


def pytest_configure(config):
    config.addinivalue_line("markers", "triton_kernels: keep dispatch's choice for segment_reduce")


@pytest.fixture(autouse=True)
def _segment_reduce_by_reference(request):
    if request.node.get_closest_marker("triton_kernels"):
        yield
        return
    from opforge.runtime import dispatch

    with contextlib.ExitStack() as stack:
        stack.enter_context(dispatch.force_variant("segment_reduce", "reference"))
        yield

"""Stream tests run ``segment_reduce`` (the windows' GPU fold) and
``nexmark_events`` (the Nexmark source) through their plain-torch references:
the Triton interpreter takes far longer per call. Tests marked
``triton_kernels`` keep dispatch's own choice."""
import contextlib

import pytest


def pytest_configure(config):
    config.addinivalue_line("markers", "triton_kernels: keep dispatch's choice for segment_reduce and nexmark_events")


@pytest.fixture(autouse=True)
def _segment_reduce_by_reference(request):
    if request.node.get_closest_marker("triton_kernels"):
        yield
        return
    from opforge.runtime import dispatch

    with contextlib.ExitStack() as stack:
        for op in ("segment_reduce", "nexmark_events"):
            stack.enter_context(dispatch.force_variant(op, "reference"))
        yield

"""Stream tests run ``segment_reduce`` (the windows' GPU fold) and
``nexmark_events`` (the Nexmark source) through their plain-torch references:
the Triton interpreter takes far longer per call. Tests marked
``triton_kernels`` keep dispatch's own choice.

The Flink oracle's job (``flink_oracle/launch.py``) starts in the background
once collection has found a test that uses its ``flink`` fixture, and those
tests run last: the job runs while the rest of the suite does."""
import contextlib
import os

import pytest

from flink_oracle import launch


def pytest_configure(config):
    config.addinivalue_line("markers", "triton_kernels: keep dispatch's choice for segment_reduce and nexmark_events")


def _needs_flink(item) -> bool:
    return "flink" in getattr(item, "fixturenames", ())


def pytest_collection_modifyitems(session, config, items):
    # the same order on every xdist worker (it only depends on the collected items)
    items[:] = [i for i in items if not _needs_flink(i)] + [i for i in items if _needs_flink(i)]


def pytest_collection_finish(session):
    if session.config.option.collectonly or os.environ.get("OPFORGE_SKIP_FLINK") == "1":
        return
    if any(_needs_flink(i) for i in session.items) and launch.problem() is None:
        launch.start(launch.session_root(session.config))


def pytest_sessionfinish(session, exitstatus):
    if exitstatus == pytest.ExitCode.INTERRUPTED or session.shouldstop or session.shouldfail:
        launch.stop()


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

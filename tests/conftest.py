"""Tests run on the CPU: Triton kernels under the interpreter, tuning off,
and the autotune cache in a throw-away folder."""

import os
import subprocess
import sys
import tempfile

os.environ.setdefault("OPFORGE_INTERPRET", "1")
os.environ["TRITON_INTERPRET"] = "1" if os.environ["OPFORGE_INTERPRET"] == "1" else "0"
os.environ.setdefault("OPFORGE_AUTOTUNE", "off")
os.environ.setdefault("OPFORGE_CACHE_DIR", tempfile.mkdtemp(prefix="opforge-test-cache-"))

import pytest  # noqa: E402
import torch  # noqa: E402


FRESH_PROCESS = "OPFORGE_TEST_FRESH_PROCESS"


def pytest_configure(config):
    config.addinivalue_line("markers", "fresh_process: the test body runs in a new Python process (Gluon "
                            "compiles in the suite's process failed after some other tests had run there)")


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    """A ``fresh_process`` test runs as ``pytest <its id>`` in a child, whose result is the test's."""
    if pyfuncitem.get_closest_marker("fresh_process") is None or os.environ.get(FRESH_PROCESS) == "1":
        return None
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", pyfuncitem.nodeid],
                         cwd=pyfuncitem.config.rootpath, env=dict(os.environ, **{FRESH_PROCESS: "1"}),
                         capture_output=True, text=True, timeout=600)
    if run.returncode != 0:
        pytest.fail(f"in a fresh process (exit {run.returncode}):\n{run.stdout[-6000:]}\n{run.stderr[-3000:]}",
                    pytrace=False)
    return True


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

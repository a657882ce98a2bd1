"""SQL tests run the hash ops (hash_join, group_by, segment_reduce, and the runtime filters'
blocked_bloom_probe) and the window functions' prefix sums (cumsum) through their plain-torch reference: the Triton interpreter takes seconds per
call at TPC-H SF0.01 sizes. Tests marked ``triton_kernels`` keep dispatch's own choice, so under
OPFORGE_INTERPRET=1 the SQL operators run the Triton hash kernels in the interpreter (on tiny
tables)."""
import contextlib

import pytest

HASH_OPS = ("hash_join", "group_by", "segment_reduce", "blocked_bloom_probe", "cumsum")


def pytest_configure(config):
    config.addinivalue_line("markers", "triton_kernels: run the SQL hash ops through dispatch's choice "
                                       "(the Triton kernels under the interpreter)")


@pytest.fixture(autouse=True)
def _hash_ops_by_reference(request):
    if request.node.get_closest_marker("triton_kernels"):
        yield
        return
    from opforge.runtime import dispatch

    with contextlib.ExitStack() as stack:
        for op in HASH_OPS:
            stack.enter_context(dispatch.force_variant(op, "reference"))
        yield

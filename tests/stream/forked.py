"""``fork_call``: the fork servers of the fault-injection jobs (``checkpoint_job.py``,
``nats_job.py``) run each job in a child of a process that imported torch and
opforge once; the tests SIGKILL those children."""

from __future__ import annotations

import os
import sys
import traceback


def fork_call(fn, *args, **kwargs) -> int:
    """Calls ``fn`` in a forked child and returns the child's pid. The child
    exits 0 when ``fn`` returns, 1 when it raises (its traceback on stderr),
    without the parent's exit handlers."""
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        fn(*args, **kwargs)
        code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

"""Runs ``flink_jobs.py`` (all oracle cases, one Flink job) once per test
session, in the background.

The job takes a minute or more, most of it the JVM and PyFlink starting.
``tests/stream/conftest.py`` starts it as soon as collection has found a test
that needs it and puts those tests last, so this process and any other
pytest-xdist worker run the rest of the suite meanwhile instead of waiting.
A file lock in the session's base temp folder makes the workers share one
run: the first takes the lock and runs the job, the others wait on it and
read its result file.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import threading
from pathlib import Path

from filelock import FileLock

from flink_oracle.cases import all_cases

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
FLINK_JOBS = HERE / "flink_jobs.py"
MAKE_TARGET = "make .venv-flink"
TIMEOUT_S = 480

_runs: dict[Path, "_Run"] = {}
_procs: list[subprocess.Popen] = []
_stopping = threading.Event()


def flink_python() -> Path:
    return Path(os.environ.get("OPFORGE_FLINK_PYTHON") or REPO / ".venv-flink" / "bin" / "python")


def problem() -> str | None:
    """Why the job cannot run on this machine, or None."""
    py = flink_python()
    if not py.exists():
        return (f"no PyFlink venv at {py}: run `{MAKE_TARGET}` (make test does), or point "
                "OPFORGE_FLINK_PYTHON at a python with apache-flink, or set OPFORGE_SKIP_FLINK=1 "
                "to skip these tests")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        return "PyFlink needs Java 17 (`java` on PATH or JAVA_HOME); set OPFORGE_SKIP_FLINK=1 to skip"
    return None


def session_root(config) -> Path:
    """The folder all of this run's xdist workers share (the controller's base temp)."""
    base = config._tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def _run_flink(py: Path, cases_json: str, workdir: Path) -> dict:
    cases_path, out_path = workdir / "cases.json", workdir / "results.json"
    cases_path.write_text(cases_json)
    # nothing of opforge's environment leaks into the Flink venv's python
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    proc = subprocess.Popen([str(py), str(FLINK_JOBS), str(cases_path), str(out_path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=workdir, env=env, start_new_session=True)
    _procs.append(proc)
    try:
        _, stderr = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        _kill(proc)
        return {"error": f"the Flink job did not finish in {TIMEOUT_S} s"}
    if proc.returncode != 0:
        return {"error": f"{py} {FLINK_JOBS.name} exited with {proc.returncode}:\n{stderr[-4000:]}"}
    return json.loads(out_path.read_text())


def _kill(proc: subprocess.Popen) -> None:
    """The job and the JVM it started (its own process group)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _result_file(root: Path) -> Path:
    """Runs the job unless this session already has its result (one run for all workers)."""
    py = flink_python()
    cases_json = json.dumps(all_cases())
    digest = hashlib.sha256((cases_json + FLINK_JOBS.read_text() + str(py)).encode()).hexdigest()[:16]
    result_file = root / f"flink-oracle-{digest}.json"
    with FileLock(str(root / f"flink-oracle-{digest}.lock")):
        if not result_file.exists():
            workdir = root / f"flink-oracle-{digest}"
            workdir.mkdir(exist_ok=True)
            data = _run_flink(py, cases_json, workdir)
            if _stopping.is_set():  # killed by stop(): no result for the other workers to read
                raise RuntimeError("the Flink oracle job was stopped with the session")
            result_file.write_text(json.dumps(data))
    return result_file


class _Run(threading.Thread):
    """The run (or the wait for another worker's), off the main thread: the
    subprocess releases the GIL, so this process keeps running tests."""

    def __init__(self, root: Path):
        super().__init__(name="flink-oracle")
        self.root, self.file, self.error = root, None, None

    def run(self):
        try:
            self.file = _result_file(self.root)
        except Exception as e:  # reported by result()
            self.error = f"{type(e).__name__}: {e}"


def start(root: Path) -> None:
    if root not in _runs:
        _runs[root] = _Run(root)
        _runs[root].start()


def result(root: Path) -> dict:
    """Every case's Flink outputs (waits for the run): ``{"flink": version, "results": {case: [rows]}}``,
    or ``{"error": text}``."""
    start(root)
    run = _runs[root]
    run.join()
    if run.error is not None:
        return {"error": run.error}
    return json.loads(run.file.read_text())


def stop() -> None:
    """Ends a job still running: a session stopped early (Ctrl-C, -x) must not wait minutes for it."""
    _stopping.set()
    for proc in _procs:
        _kill(proc)

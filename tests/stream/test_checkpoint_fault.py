"""Fault injection: a checkpointed job (file + collection sources, a windowed
aggregation, keyed state and timers, transactional file sinks) runs as a
subprocess (a fork of a server process that imported everything once), is
killed with SIGKILL at random moments and restarted from its latest
checkpoint until it finishes. Its committed output must equal a
failure-free run's exactly: no record lost, none twice, same order per subtask."""

import json
import os
import random
import select
import subprocess
import sys
import threading
from collections import Counter

import pytest

import checkpoint_job as job
from checkpoint_job import per_subtask_rows

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


@pytest.fixture(scope="module")
def data_and_reference(tmp_path_factory):
    base = tmp_path_factory.mktemp("fault")
    data = str(base / "data")
    job.write_data(data)
    ref = str(base / "reference")
    job.run(data, ref, str(base / "reference-ckpt"), restore=False)
    return data, {s: per_subtask_rows(os.path.join(ref, s)) for s in ("windows", "summary")}


def test_failure_free_run_matches_a_python_model(data_and_reference):
    """The reference itself: window counts and sums per (key, window) from plain Python."""
    data, ref = data_and_reference
    import pyarrow.parquet as pq

    evs = [tuple(r.values()) for f in sorted(os.listdir(data))
           for r in pq.read_table(os.path.join(data, f)).to_pylist()]
    evs += job.events(job.COLLECTION, 7)
    want = Counter()
    sums = Counter()
    for k, v, t in evs:
        want[(k, t // 50 * 50)] += 1
        sums[(k, t // 50 * 50)] += v
    got = [r for rows in ref["windows"].values() for r in rows]
    assert {(r["key"], r["window_start"]): r["n"] for r in got} == dict(want)
    assert {(r["key"], r["window_start"]): r["total"] for r in got} == dict(sums)
    assert len(got) == len(want)
    summary = [r for rows in ref["summary"].values() for r in rows]
    assert sum(r["in_bucket"] for r in summary) == len(evs)  # each record counted in one bucket once


class JobServer:
    """``checkpoint_job.py --serve``: each run a forked child of one process that
    imported torch and opforge once (a run in a fresh interpreter spent most of
    its time importing)."""

    def __init__(self, log_prefix):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "src"), HERE,
                                                           os.environ.get("PYTHONPATH", "")]))
        self.log_prefix, self.runs = log_prefix, 0
        self.proc = subprocess.Popen([sys.executable, os.path.join(HERE, "checkpoint_job.py"), "--serve"], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def run(self, *argv, timeout=120):
        """One run of the job: (exit status, its stdout, its stderr)."""
        self.runs += 1
        paths = {"stdout": f"{self.log_prefix}{self.runs}.out", "stderr": f"{self.log_prefix}{self.runs}.err"}
        self.proc.stdin.write(json.dumps({"argv": list(argv), **paths}) + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        assert ready, f"a run did not end in {timeout} s"
        returncode = json.loads(self.proc.stdout.readline())
        outputs = []
        for path in paths.values():
            with open(path) as f:
                outputs.append(f.read())
        return returncode, *outputs

    def close(self):
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # a run that hangs (reported by run)
            self.proc.kill()
            self.proc.wait()


def run_with_kills(seed, data, out, ckpt, max_kills, log):
    rng = random.Random(seed)
    server = JobServer(f"{out}-run")
    kills = 0
    try:
        while True:
            delay = rng.uniform(0.25, 1.4) if kills < max_kills else -1.0
            # the first kill lands anywhere (often before any checkpoint); the later ones after a checkpoint
            # completed, so the restore path is exercised on a slow machine too
            spec = f"c{delay / 4:.3f}" if 0 < kills < max_kills else f"{delay:.3f}"
            returncode, stdout, stderr = server.run(data, out, ckpt, spec)
            log.append((delay, returncode, stdout.strip(), stderr[-2000:]))
            if returncode == 0:
                return kills
            assert returncode == -9, stderr[-3000:]
            kills += 1
    finally:
        server.close()


def test_sigkill_at_random_points_then_restore_is_exactly_once(data_and_reference, tmp_path):
    data, ref = data_and_reference
    seeds = [11, 12]  # run side by side (two cores)
    logs = {s: [] for s in seeds}
    kills, errors = {}, {}

    def one(seed):
        try:
            kills[seed] = run_with_kills(seed, data, str(tmp_path / f"out{seed}"), str(tmp_path / f"ckpt{seed}"),
                                         2, logs[seed])
        except BaseException as e:  # reported below
            errors[seed] = e

    threads = [threading.Thread(target=one, args=(s,)) for s in seeds]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, (errors, logs)
    assert sum(kills.values()) >= 2, logs  # the job really was killed
    restored = [out for s in seeds for (_, _, out, _) in logs[s] if "start restoring=None" not in out]
    assert restored, logs  # at least one run started from a checkpoint
    for s in seeds:
        for sink in ("windows", "summary"):
            got = per_subtask_rows(str(tmp_path / f"out{s}" / sink))
            assert got == ref[sink], (s, sink, logs[s])
        leftovers = [n for sink in ("windows", "summary") for n in os.listdir(tmp_path / f"out{s}" / sink)
                     if n.startswith(".")]
        assert leftovers == [], leftovers  # no pending or in-progress file survives the final commit

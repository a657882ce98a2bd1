"""The first query run freezes what the process holds (``sql/gc_freeze.py``), so the cyclic
collector's full passes no longer rescan the imports inside later queries' planning; once, and
not with ``OPFORGE_GC_FREEZE=0``. In a fresh process: the suite's own has frozen long ago."""
import json
import os
import subprocess
import sys

CHILD = r"""
import gc, json, os
from opforge import sql
from opforge.sql import gc_freeze

freezes, freeze = [], gc.freeze
gc.freeze = lambda: (freezes.append(1), freeze())
con = sql.connect("cpu")
out = {}
os.environ[gc_freeze.ENV] = "0"
con.sql("SELECT 1 AS a").fetchall()
out["off"] = (len(freezes), gc.get_freeze_count())
del os.environ[gc_freeze.ENV]
out["tracked_before"] = len(gc.get_objects())
out["answer"] = con.sql("SELECT 2 AS a, 'x' AS b").fetchall()
out["frozen"] = gc.get_freeze_count()
out["tracked_after"] = len(gc.get_objects())
con.sql("SELECT 3 AS a").fetchall()
out["freezes"] = len(freezes)
print(json.dumps(out))
"""


def test_first_query_freezes_once_unless_turned_off():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    env.pop("OPFORGE_GC_FREEZE", None)
    run = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["off"] == [0, 0]  # turned off: the first query froze nothing
    assert got["answer"] == [[2, "x"]]
    assert got["frozen"] > got["tracked_before"] // 2  # the imports' objects, now out of the collector's passes
    assert got["tracked_after"] < got["tracked_before"] // 10
    assert got["freezes"] == 1  # once: later queries freeze nothing more

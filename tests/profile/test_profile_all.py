"""benchmarks/profile_all.py: every op through `config_sweep`, compiled together first."""

import json
import os
import sys

from ptxas_mark import needs_ptxas

BENCHMARKS = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks")


@needs_ptxas
def test_profile_all_writes_a_row_per_op(tmp_path):
    sys.path.insert(0, os.path.abspath(BENCHMARKS))
    try:
        import profile_all
    finally:
        sys.path.remove(os.path.abspath(BENCHMARKS))
    out = tmp_path / "all.json"
    assert profile_all.main(["--op", "softmax", "--op", "cumsum", "--jobs", "2", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["op"] for r in rows] == ["opforge::cumsum", "opforge::softmax"]
    for r in rows:
        assert "error" not in r and r["variant"].startswith("triton_")
        assert r["kernels"] and all(k["registers"] > 0 and 0 < k["occupancy"] <= 1 for k in r["kernels"])

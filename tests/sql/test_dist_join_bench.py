"""``benchmarks/dist_join.py --quick`` on 2 Gloo ranks: both methods timed for every shape, every
union of the ranks' pairs equal to the single-process join, the planner's pick recorded (CPU
figures: the shapes are small, the timings not a claim)."""
import importlib.util
import json
import os
from pathlib import Path

import pytest
import torch.distributed as dist

from opforge.sql.planner.distribution import choose_distribution
from spawn_ranks import run_ranks

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "dist_join.py"

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="no Gloo")


def _rank(rank, world, port, argv, out_q):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), OMP_NUM_THREADS="1", OPFORGE_DIST_TIMEOUT="60",
                      OPFORGE_INTERPRET="0", TRITON_INTERPRET="0")  # a plain CPU run, as under torchrun
    import torch

    torch.set_num_threads(1)
    try:
        spec = importlib.util.spec_from_file_location("dist_join_bench", BENCH)
        bench = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(bench)
        out_q.put((rank, bench.main(argv), None))
    except BaseException:  # noqa: BLE001 - the test reports it
        import traceback

        out_q.put((rank, "error", traceback.format_exc()))


def test_quick_bench_times_both_methods_and_checks_them(tmp_path):
    path = tmp_path / "dj.json"
    argv = ["--quick", "--backend", "gloo", "--repeats", "3", "--json", str(path)]
    results = run_ranks(_rank, (argv,), world=2, timeout=90)
    bad = [r[2] or f"rank {r[0]} exited {r[1]} (a check failed)" for r in results if r[1] != 0]
    assert not bad, "\n".join(bad)
    out = json.loads(path.read_text())
    assert out["world_size"] == 2 and out["backend"] == "gloo" and out["cpu_figures"] and out["quick"]
    assert out["schema_version"] == 1 and out["torch"] and out["device"] and out["date"]
    shapes = {}
    for row in out["rows"]:
        shapes.setdefault((row["case"], row["build_rows"], row["probe_rows"]), []).append(row)
    assert len(shapes) == out["summary"]["shapes"] >= 7
    assert any(case.startswith("zipf") for case, _, _ in shapes)
    for rows in shapes.values():
        assert sorted(r["method"] for r in rows) == ["broadcast", "partitioned"]
        fastest = min(rows, key=lambda r: r["median_ms"])["method"]
        for r in rows:
            assert r["checks"] and all(r["checks"].values()), r
            assert r["planner_pick"] in ("broadcast", "partitioned") and r["faster_method"] == fastest
            assert r["planner_right"] == (r["planner_pick"] == fastest)
            assert r["median_ms"] > 0 and r["tuples_per_s"] > 0 and len(r["runs_ms"]) == 3
            assert r["pairs"] == r["probe_rows"]  # every fact row meets exactly one dimension row
            if r["method"] == "broadcast":
                assert r["bytes_moved"] == r["bytes_moved_planner"]  # the planner's formula, exactly
            # the planner's rule on the bytes that move (key + row id, 16 B a row)
            assert r["planner_pick"] == choose_distribution(16 * r["build_rows"], 16 * r["probe_rows"], 2).method
    zipf = next(r for rows in shapes.values() for r in rows if r["case"].startswith("zipf")
                and r["method"] == "partitioned")
    assert zipf["heavy_keys"] >= 1 and zipf["max_rank_load_rows"] <= 1.2 * zipf["mean_rank_load_rows"]

"""The overlap bench on 2 Gloo ranks: every figure present, consistent, and the
overlapped results checked (CPU figures: the shapes are tiny, the timings not a claim)."""

import json

from dist_ranks import BACKEND
from opforge.distributed import bench


def test_quick_bench_reports_every_figure(ranks2, tmp_path):
    results = ranks2.run("bench_quick", timeout=120)
    assert results[0]["entries"] == results[1]["entries"]  # every figure is agreed over the ranks
    r = results[0]
    assert r["world_size"] == 2 and r["backend"] == BACKEND and r["cpu_figures"] == (BACKEND == "gloo")
    ops = [e["op"] for e in r["entries"]]
    assert ops == ["opforge.distributed.all_gather_matmul"] * 2 + ["opforge.distributed.matmul_reduce_scatter"] * 2
    for e in r["entries"]:
        assert e["correct"], e
        assert min(e["compute_ms"], e["comm_ms"], e["sequential_ms"], e["median_ms"]) > 0
        assert e["median_ms"] == min(run["overlapped_ms"] for run in e["chunk_runs"])
        best = next(run for run in e["chunk_runs"] if run["overlapped_ms"] == e["median_ms"])
        assert e["variant"] == bench.run_name(best) and e["variant"].startswith(f"chunks={best['chunks']},")
        hidden = (e["sequential_ms"] - e["median_ms"]) / min(e["comm_ms"], e["compute_ms"])
        assert abs(best["efficiency"] - hidden) < 1e-9
        assert all(run["identical_to_unoverlapped"] for run in e["chunk_runs"])
        assert all((run["matmul_variant"] == "torch.matmul") == (BACKEND == "gloo") for run in e["chunk_runs"])
    path = tmp_path / "out.json"
    bench.write_json(r, str(path))
    assert json.loads(path.read_text())["entries"][0]["shape"] == list(bench.QUICK_SHAPES["all_gather_matmul"][0])

"""The report: schema, derived rates, terminal tables, JSON/HTML/PNG files."""

import copy
import json

import pytest
from rich.console import Console

from opforge.profile import report as R
from opforge.profile.occupancy import theoretical_occupancy

CEIL = {"copy_tbps": 4.0, "bf16_tflops": 800.0, "method": "test"}


def kernel(name="m:k", regs=32, smem=0, warps=4):
    occ = theoretical_occupancy(regs, smem, warps)
    return {"kernel": name, "registers": regs, "spill_stores": 0, "spill_loads": 0, "shared_bytes": smem,
            "num_warps": warps, "num_stages": 3, "occupancy": occ.to_dict(), "arch": 90}


NCU = {"kernel": "k", "block": "(128, 1, 1)", "grid": "(8, 1, 1)", "duration_ns": 1000.0,
       "dram_throughput_pct": 88.0, "dram_bytes": 4e6, "dram_tbps": 4.0, "achieved_occupancy_pct": 70.0,
       "theoretical_occupancy_pct": 100.0, "registers_per_thread": 32.0, "shared_bank_conflicts_ld": 12.0,
       "shared_bank_conflicts_st": 3.0, "global_ld_sectors_per_request": 4.0,
       "global_st_sectors_per_request": 32.0, "stall_cycles": {"long_scoreboard": 3.0, "wait": 1.0},
       "stall_shares": {"long_scoreboard": 0.75, "wait": 0.25}, "top_stalls": ["long_scoreboard", "wait"]}


def ladder(timed=True, with_ncu=True):
    rows = [R.make_row("naive", description="strided stores", kernels=[kernel(regs=64, warps=8)],
                       median_ms=2.0 if timed else None, nbytes=4e9, flops=0, ceilings=CEIL if timed else None,
                       ncu=[NCU] if with_ncu else None, correct=True),
            R.make_row("tiled", kernels=[kernel(smem=4096)], median_ms=1.25 if timed else None, nbytes=4e9,
                       flops=1e9, ceilings=CEIL if timed else None, correct=False)]
    return R.new_report("ladder", "test ladder", rows, ceilings=CEIL if timed else None, notes=["n"])


def test_make_row_rates():
    row = R.make_row("r", kernels=[kernel(regs=128, warps=8)], median_ms=2.0, nbytes=4e9, flops=2e12,
                     ceilings=CEIL)
    assert row["tbps"] == pytest.approx(2.0)            # 4 GB in 2 ms
    assert row["tflops"] == pytest.approx(1000.0)       # 2 TFLOP in 2 ms
    assert row["pct_copy_bw"] == pytest.approx(50.0)
    # floor: max(4e9 / 4e12, 2e12 / 800e12) = 2.5 ms > 2 ms measured: 125 %
    assert row["pct_roofline"] == pytest.approx(125.0)
    assert row["occupancy"] == pytest.approx(0.25)      # 128 regs x 8 warps: 2 blocks, 16 warps
    untimed = R.make_row("u", kernels=[kernel()])
    assert untimed["tbps"] is None and untimed["pct_roofline"] is None


def test_schema_validation_names_what_is_wrong():
    rep = ladder()
    R.validate(rep)
    json.loads(json.dumps(rep))
    assert rep["schema_version"] == R.SCHEMA_VERSION and rep["device"]["type"] in ("cpu", "cuda")
    assert rep["limits"]["registers_per_sm"] == 65536 or rep["device"]["type"] == "cuda"
    bad = copy.deepcopy(rep)
    del bad["rows"][1]["tbps"]
    bad["kind"] = "nope"
    bad["rows"][0]["kernels"][0].pop("registers")
    with pytest.raises(ValueError) as e:
        R.validate(bad)
    msg = str(e.value)
    assert "rows[1] missing tbps" in msg and "kind 'nope'" in msg and "registers" in msg
    with pytest.raises(ValueError, match="kind"):
        R.new_report("other", "t", [])


@pytest.mark.parametrize("timed, with_ncu", [(True, True), (False, False)])
def test_files_written_and_not_empty(tmp_path, timed, with_ncu):
    rep = ladder(timed, with_ncu)
    paths = R.write_all(rep, tmp_path / "out", "ladder")
    assert json.loads(paths["json"].read_text())["rows"][0]["label"] == "naive"
    png = paths["png"].read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    page = paths["html"].read_text()
    assert page.startswith("<!doctype html>") and "data:image/png;base64," in page
    assert "test ladder" in page and "naive" in page and "WRONG" in page
    assert ("Nsight Compute" in page) == with_ncu and ("long_scoreboard 75%" in page) == with_ncu


def test_terminal_tables():
    con = Console(record=True, width=200)
    R.print_report(ladder(), con)
    text = con.export_text()
    for s in ("naive", "tiled", "WRONG", "4.00/32.00", "long_scoreboard 75%", "compiled resources"):
        assert s in text, s


def test_op_report_from_a_sweep():
    from opforge.profile.sweep import Sweep, SweepRow

    class V:
        name = "triton_row"

    class O:
        qualname = "opforge::softmax"

    class D:
        op, variant, config, source = O, V, {"BLOCK_R": 1, "num_warps": 4}, "default"

        def __str__(self):
            return "opforge::softmax: runs triton_row"

    rows = [SweepRow({"BLOCK_R": 1, "num_warps": 4}, True, [kernel(warps=4)], median_ms=1.0),
            SweepRow({"BLOCK_R": 4, "num_warps": 8}, False, [kernel(regs=128, warps=8)], median_ms=1.02),
            SweepRow({"BLOCK_R": 8, "num_warps": 16}, False, [], error="out of resources")]
    sw = Sweep("opforge::softmax", "triton_row", "default", 4e9, 1e9, True, rows, True, CEIL)
    rep = R.op_report(D(), sw, ncu_rows=[NCU], args_desc="64x1024 bf16")
    assert rep["kind"] == "op" and rep["variant"] == "triton_row" and rep["flops_assumed"]
    labels = [r["label"] for r in rep["rows"]]
    assert labels == ["BLOCK_R=4 num_warps=8", "BLOCK_R=1 num_warps=4", "BLOCK_R=8 num_warps=16"]  # by occupancy
    chosen = [r for r in rep["rows"] if r["chosen"]]
    assert len(chosen) == 1 and chosen[0]["ncu"] == [NCU] and chosen[0]["tbps"] == pytest.approx(4.0)
    # occupancy 25 % reaches 4e9 / 1.02 ms, within 5 % of the best: more occupancy stopped paying
    assert rep["occupancy_pays"]["occupancy"] == pytest.approx(0.25)
    assert any("FLOPs assumed" in n for n in rep["notes"])
    R.validate(rep)

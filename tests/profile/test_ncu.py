"""ncu: command line, CSV parsing, the folded figures, and clear failures,
with a hand-written sample of ncu's ``--csv --page raw`` output and a fake
ncu executable (no GPU, no Nsight Compute needed)."""

import json
import os
import stat
import sys

import pytest

from opforge.profile import ncu as N

# A recorded-by-hand sample in ncu's --csv --page raw layout: log lines, the
# header (fixed columns, then one per metric), the units row, one row per
# profiled kernel. Values use ncu's thousands separators.
STALLS = {"long_scoreboard": "120.5", "barrier": "10", "short_scoreboard": "30", "wait": "39.5"}
HEADER = ['"ID"', '"Process ID"', '"Process Name"', '"Host Name"', '"Kernel Name"', '"Context"', '"Stream"',
          '"Block Size"', '"Grid Size"', '"Device"', '"CC"']


def sample_csv(kernels=("transpose_tiled_kernel",)) -> str:
    metrics = [(N.DRAM_PCT, "%", "91.25"), (N.ACHIEVED_OCC, "%", "78.5"), (N.THEORETICAL_OCC, "%", "100"),
               (N.BANK_LD, "", "1,024"), (N.BANK_ST, "", "0"), (N.SECTORS_LD, "sector", "2,097,152"),
               (N.REQUESTS_LD, "", "524,288"), (N.SECTORS_ST, "sector", "16,777,216"),
               (N.REQUESTS_ST, "", "524,288"), (N.DURATION, "nsecond", "250,000"),
               (N.DRAM_READ, "byte", "268,435,456"), (N.DRAM_WRITE, "byte", "268,435,456"),
               (N.REGISTERS, "register/thread", "32")]
    metrics += [(N.STALL_PREFIX + r + N.STALL_SUFFIX, "", STALLS.get(r, "n/a")) for r in N.STALL_REASONS]
    lines = ["==PROF== Connected to process 4242 (/usr/bin/python3.12)",
             '==PROF== Profiling "transpose_tiled_kernel" - 0: 0%....50%....100% - 38 passes',
             "==PROF== Disconnected from process 4242",
             ",".join(HEADER + [f'"{m}"' for m, _, _ in metrics]),
             ",".join(['""'] * len(HEADER) + [f'"{u}"' for _, u, _ in metrics])]
    for i, k in enumerate(kernels):
        fixed = [f'"{i}"', '"4242"', '"python3.12"', '"127.0.0.1"', f'"{k}"', '"1"', '"7"', '"(128, 1, 1)"',
                 '"(256, 256, 1)"', '"0"', '"9.0"']
        lines.append(",".join(fixed + [f'"{v}"' for _, _, v in metrics]))
    return "\n".join(lines) + "\n"


def test_metric_names_are_the_documented_ones():
    for m in ("dram__throughput.avg.pct_of_peak_sustained_elapsed", "sm__warps_active.avg.pct_of_peak_sustained_active",
              "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
              "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum",
              "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum", "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum",
              "smsp__average_warp_latency_issue_stalled_long_scoreboard.ratio"):
        assert m in N.METRICS
    assert len(set(N.METRICS)) == len(N.METRICS)


def test_command_line():
    job = {"callable": "m:f", "kwargs": {"n": 3}}
    cmd = N.command("/opt/ncu", job, ["opforge.kernels.softmax:row_forward_kernel", "split_kernel"],
                    launch_skip=6, launch_count=2, python="/py")
    assert cmd[0] == "/opt/ncu"
    s = " ".join(cmd)
    assert "--clock-control none" in s and "--target-processes all" in s
    assert "--csv --page raw" in s and "--print-units base" in s
    assert cmd[cmd.index("--kernel-name") + 1] == "regex:^(row_forward_kernel|split_kernel)$"
    assert cmd[cmd.index("--launch-skip") + 1] == "6" and cmd[cmd.index("--launch-count") + 1] == "2"
    assert cmd[cmd.index("--metrics") + 1].split(",") == list(N.METRICS)
    assert cmd[-4:-1] == ["/py", "-m", "opforge.profile._ncu_target"] and json.loads(cmd[-1]) == job
    assert "--set" not in cmd and not any("clock" in c and c != "--clock-control" for c in cmd[:-1])
    with pytest.raises(ValueError):
        N.command("ncu", job, ["k"], launch_skip=-1)
    with pytest.raises(ValueError):
        N.kernel_regex([])
    assert N.kernel_regex(["a.b:k_1"]) == "regex:^(k_1)$"


def test_parse_raw_csv_and_fold():
    rows = N.parse_csv(sample_csv(("transpose_tiled_kernel", "other_kernel")))
    assert [r.kernel for r in rows] == ["transpose_tiled_kernel", "other_kernel"]
    r = rows[0]
    assert r.raw[N.BANK_LD] == 1024 and r.raw[N.SECTORS_ST] == 16777216
    assert r.block == "(128, 1, 1)" and r.grid == "(256, 256, 1)"
    assert N.STALL_PREFIX + "misc" + N.STALL_SUFFIX not in r.raw  # n/a dropped
    f = N.fold(r)
    assert f["dram_throughput_pct"] == pytest.approx(91.25)
    assert f["achieved_occupancy_pct"] == pytest.approx(78.5)
    assert f["global_ld_sectors_per_request"] == pytest.approx(4.0)
    assert f["global_st_sectors_per_request"] == pytest.approx(32.0)
    assert f["shared_bank_conflicts_ld"] == 1024 and f["shared_bank_conflicts_st"] == 0
    # 512 MiB in 250 µs = 2.147 TB/s
    assert f["dram_tbps"] == pytest.approx(2 * 268435456 / 250e-6 / 1e12)
    assert f["top_stalls"] == ["long_scoreboard", "wait", "short_scoreboard"]
    assert f["stall_shares"]["long_scoreboard"] == pytest.approx(120.5 / 200)
    assert sum(f["stall_shares"].values()) == pytest.approx(1.0)
    json.dumps(f)


def test_scaled_units_are_converted_to_base():
    text = sample_csv().replace('"nsecond"', '"usecond"').replace('"250,000"', '"250"')
    f = N.fold(N.parse_csv(text)[0])
    assert f["duration_ns"] == pytest.approx(250000)


def test_parse_long_form_details_page():
    text = ('"ID","Kernel Name","Section Name","Metric Name","Metric Unit","Metric Value"\n'
            f'"0","k","Raw","{N.SECTORS_LD}","sector","800"\n'
            f'"0","k","Raw","{N.REQUESTS_LD}","","100"\n'
            f'"0","k","Raw","{N.DRAM_PCT}","%","n/a"\n')
    (r,) = N.parse_csv(text)
    assert N.fold(r)["global_ld_sectors_per_request"] == 8 and N.fold(r)["dram_throughput_pct"] is None


def test_no_table_is_a_clear_error():
    with pytest.raises(N.NcuError, match="no ncu CSV table"):
        N.parse_csv("==PROF== Connected\n==WARNING== No kernels were profiled.\n")


def test_missing_ncu(monkeypatch, tmp_path):
    monkeypatch.delenv("OPFORGE_NCU", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(N, "_COMMON_PATHS", (str(tmp_path / "nowhere" / "ncu"),))
    with pytest.raises(N.NcuError, match="ncu.*not found.*OPFORGE_NCU"):
        N.find_ncu()
    monkeypatch.setenv("OPFORGE_NCU", str(tmp_path / "absent"))
    with pytest.raises(N.NcuError, match="OPFORGE_NCU"):
        N.find_ncu()


def test_failure_messages():
    perm = "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance Counters"
    assert "performance counters" in N.explain_failure(perm, 1) and "root" in N.explain_failure(perm, 1)
    assert "no kernel" in N.explain_failure("==WARNING== No kernels were profiled.", 0)
    assert "exit code 9" in N.explain_failure("==ERROR== something broke", 9)
    assert N.missing_metrics("==ERROR== Failed to find metric smsp__x.ratio") == {"smsp__x.ratio"}


def _fake_ncu(tmp_path, body: str) -> str:
    path = tmp_path / "ncu"
    path.write_text(f"#!{sys.executable}\nimport sys\nargs = sys.argv[1:]\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_run_job_with_a_fake_ncu(tmp_path):
    # the fake checks the flags it must get, drops a metric it "does not know"
    # (the retry path), then prints the sample
    sample = sample_csv()
    log = tmp_path / "calls.txt"
    exe = _fake_ncu(tmp_path, f"""
open({str(log)!r}, "a").write(" ".join(args) + "\\n")
assert args[args.index("--clock-control") + 1] == "none"
assert args[args.index("--launch-skip") + 1] == "4", args
metrics = args[args.index("--metrics") + 1].split(",")
if "{N.REGISTERS}" in metrics:
    print("==ERROR== Failed to find metric {N.REGISTERS}")
    sys.exit(1)
sys.stdout.write({sample!r})
""")
    out = N.run_job({"callable": "m:f"}, ["m:transpose_tiled_kernel"], launches_per_call=2, warmup=2, ncu=exe)
    assert len(out) == 1 and out[0]["global_st_sectors_per_request"] == pytest.approx(32.0)
    calls = log.read_text().splitlines()
    assert len(calls) == 2 and N.REGISTERS in calls[0] and N.REGISTERS not in calls[1]
    assert '"warmup": 2' in calls[1]


def test_run_job_without_counter_access(tmp_path):
    exe = _fake_ncu(tmp_path, 'print("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access '
                              'NVIDIA GPU Performance Counters on the target device 0.")\nsys.exit(1)\n')
    with pytest.raises(N.NcuError, match="performance counters"):
        N.run_job({"callable": "m:f"}, ["k"], ncu=exe)


def test_ncu_target_runs_a_step(tmp_path, monkeypatch):
    # the target's loop on CPU: torch.cuda.synchronize is the only CUDA call
    from opforge.profile import _ncu_target

    monkeypatch.setattr("torch.cuda.synchronize", lambda *a: None)
    _STEP_CALLS.clear()
    job = {"callable": f"{__name__}:_make_step", "kwargs": {"tag": "x"}, "warmup": 3,
           "sys_path": [os.path.dirname(__file__)]}
    assert _ncu_target.main(["prog", json.dumps(job)]) == 0
    assert _STEP_CALLS == ["x"] * 4


_STEP_CALLS: list = []


def _make_step(tag):
    return lambda: _STEP_CALLS.append(tag)

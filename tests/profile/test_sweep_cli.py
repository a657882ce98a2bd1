"""Config sweep, user-kernel launches and the ``opforge profile`` command,
compiled for sm_90 in a child process (no GPU)."""

import json

import pytest
import torch

import kernels_for_test as K
from opforge.profile import kernel_resources, theoretical_occupancy
from opforge.profile import report as R
from opforge.profile import sweep as S
from opforge.profile.resources import launches_resources
from ptxas_mark import needs_ptxas


def test_pick_configs():
    cands = [{"a": i} for i in range(10)]
    out = S.pick_configs({"a": 3}, cands, 4)
    assert out[0] == {"a": 3} and len(out) == 4 and len({json.dumps(c) for c in out}) == 4
    assert S.pick_configs({"a": 99}, cands[:2], 8) == [{"a": 99}, {"a": 0}, {"a": 1}]
    assert S.pick_configs({"a": 1}, cands, 1) == [{"a": 1}]


def test_count_bytes_is_inputs_plus_outputs():
    import opforge.ops.softmax  # noqa: F401
    from opforge.runtime.registry import get

    x = torch.empty(64, 1024, dtype=torch.bfloat16, device="meta")
    assert S.count_bytes(get("softmax"), (x, -1)) == (2 * 64 * 1024 * 2, 64 * 1024)


@needs_ptxas
def test_sweep_softmax_with_a_timer():
    # a fake timer (ms grows with the config's rows per program): the rates are
    # the counted bytes over that time, the chosen config is dispatch's
    x = torch.randn(16, 256)
    ms = {1: 1.0, 2: 2.0, 4: 4.0}
    configs = [{"BLOCK_R": 1, "num_warps": 2}, {"BLOCK_R": 2, "num_warps": 4}, {"BLOCK_R": 4, "num_warps": 4}]
    calls = []

    def timer(fn):
        fn()  # the config really runs (under the interpreter)
        calls.append(1)
        return ms[configs[len(calls) - 1]["BLOCK_R"]]

    sw = S.sweep("softmax", x, -1, variant="triton_row", configs=configs, timer=timer)
    assert [r.config for r in sw.rows] == configs and sw.variant == "triton_row" and sw.timed
    assert sw.nbytes == 2 * 16 * 256 * 4 and sw.flops_assumed and sw.ceilings is None
    for r, t in zip(sw.rows, (1.0, 2.0, 4.0)):
        assert r.error == "" and r.median_ms == t
        assert r.tbps == pytest.approx(sw.nbytes / (t * 1e-3) / 1e12)
        (k,) = r.kernels
        assert k["kernel"] == "opforge.kernels.softmax:row_forward_kernel" and k["num_warps"] == r.config["num_warps"]
        assert k["constexprs"]["BLOCK_R"] == str(r.config["BLOCK_R"])
        occ = theoretical_occupancy(k["registers"], k["shared_bytes"], k["num_warps"])
        assert r.occupancy == occ.occupancy
    pays = S.occupancy_pays(sw)
    assert pays["config"] == configs[0] and pays["best_tbps"] == pytest.approx(sw.rows[0].tbps)
    from opforge.profile.resources import decide_for_profile

    decision = decide_for_profile("softmax", (x, -1), "triton_row")
    rep = R.op_report(decision, sw, args_desc="16x256")
    R.validate(rep)
    assert sum(r["chosen"] for r in rep["rows"]) == (decision.config in configs)


@needs_ptxas
def test_user_kernel_launches():
    # the JIT's own specialization (16-byte-aligned pointers, n % 16 == 0);
    # one compile child for all launches; a launch that cannot bind is reported
    x, y = torch.empty(4096), torch.empty(4096)
    good, small, bad = launches_resources([(K.scale_kernel, (x, y, 4096, 2.0), {"BLOCK": 1024, "num_warps": 8}),
                                           (K.scale_kernel, (x, y, 4096, 2.0), {"BLOCK": 256}),
                                           (K.scale_kernel, (x, y, 4096), {"BLOCK": 256})])
    assert good.kernel == "kernels_for_test:scale_kernel" and good.num_warps == 8 and good.registers > 0
    assert good.signature == {"x_ptr": "*fp32", "y_ptr": "*fp32", "n": "i32", "alpha": "fp32"}
    assert good.constexprs == {"BLOCK": "1024"}
    assert good.occupancy == theoretical_occupancy(good.registers, good.shared_bytes, 8)
    assert small.num_warps == 4 and isinstance(bad, str) and "alpha" in bad


@needs_ptxas
def test_user_kernel_must_be_importable():
    import triton
    import triton.language as tl

    @triton.jit
    def local_kernel(x_ptr, BLOCK: tl.constexpr):
        tl.store(x_ptr + tl.arange(0, BLOCK), 1.0)

    with pytest.raises(ValueError, match="cannot be imported by name"):
        kernel_resources(local_kernel, torch.empty(16), BLOCK=16)


@needs_ptxas
def test_profile_command_writes_a_report(tmp_path, capsys):
    from opforge.cli import main

    out = tmp_path / "r.json"
    code = main(["profile", "softmax", "--shape", "4x64", "--dtype", "fp32", "--arg", "-1", "--no-sweep",
                 "--json", str(out), "--html", str(tmp_path / "r.html"), "--ncu"])
    text = capsys.readouterr().out
    rep = json.loads(out.read_text())
    R.validate(rep)
    assert rep["kind"] == "op" and rep["op"] == "opforge::softmax" and len(rep["rows"]) == 1
    assert rep["rows"][0]["kernels"][0]["kernel"].endswith(":row_forward_kernel")
    assert (tmp_path / "r.html").stat().st_size > 5000
    if not torch.cuda.is_available():
        # --ncu without a GPU: a clear message, the rest of the report still written, exit 1
        assert code == 1 and "needs a CUDA device" in rep["ncu_error"] and "needs a CUDA device" in text


@needs_ptxas
def test_profile_command_takes_a_bench_case(tmp_path):
    """--case: a bench case's inputs (several tensors: logits and targets), the op it names."""
    from opforge.cli import main

    main(["profile", "--case", "cross_entropy_fused 32x300", "--no-sweep", "--out", str(tmp_path)])
    rep = json.loads((tmp_path / "profile-cross_entropy_fused.json").read_text())
    R.validate(rep)
    assert rep["op"] == "opforge::cross_entropy_fused" and rep["args"] == "cross_entropy_fused 32x300 fwd+bwd float32"
    assert rep["rows"][0]["kernels"][0]["kernel"].endswith(":forward_kernel")


def test_profile_command_errors(capsys):
    from opforge.cli import main

    assert main(["profile", "--case", "softmax"]) == 1
    assert "bench cases match 'softmax'" in capsys.readouterr().out
    assert main(["profile", "softmax", "--case", "softmax 64x256"]) == 1
    assert "give no OP" in capsys.readouterr().out
    assert main(["profile", "softmax"]) == 1
    assert "--shape" in capsys.readouterr().out

    assert main(["profile", "no_such_op", "--shape", "4x4"]) == 1
    assert "no op named" in capsys.readouterr().out
    assert main(["profile", "softmax", "--shape", "4x4", "--dtype", "int7"]) == 1
    assert "--dtype" in capsys.readouterr().out
    assert main(["profile", "softmax", "--shape", "4by4"]) == 1
    assert "4096x1024" in capsys.readouterr().out


def test_profile_kernel_row(monkeypatch):
    # the launch API's arithmetic, with the compile child replaced by canned resources
    from opforge.profile import compare, resources
    from opforge.profile.occupancy import theoretical_occupancy as occ

    seen = {}

    def fake(fn, *args, **kwargs):
        seen.update(args=args, kwargs=kwargs)
        return resources.Resources("kernels_for_test:scale_kernel", 40, 0, 0, 0, 8, 3, occ(40, 0, 8))

    monkeypatch.setattr(resources, "kernel_resources", fake)
    x, y = torch.empty(1000), torch.empty(1000)
    row = compare.profile_kernel(K.scale_kernel, (4,), x, y, 1000, 2.0, BLOCK=256, num_warps=8)
    assert seen["kwargs"] == {"BLOCK": 256, "num_warps": 8} and seen["args"][2:] == (1000, 2.0)
    assert row["label"] == "scale_kernel" and row["kernels"][0]["registers"] == 40
    assert row["occupancy"] == occ(40, 0, 8).occupancy and row["median_ms"] is None  # CPU: not timed
    with pytest.raises(ValueError, match="compare"):
        compare.profile_kernel(K.scale_kernel, (4,), x, y, 1000, 2.0, BLOCK=256, ncu=True)


def test_profile_names_the_arguments_an_op_is_missing():
    from opforge.profile import ProfileError
    from opforge.profile.resources import decide_for_profile

    with pytest.raises(ProfileError, match=r"softmax takes \(x, dim\).*--arg"):
        decide_for_profile("softmax", (torch.empty(4, 8, device="meta"),))


@needs_ptxas
def test_many_ops_compile_together_in_parallel_children_in_order():
    """``ops_config_resources`` over two children gives each item its configs'
    resources in order, the same as one op at a time; ``sweep`` takes them as given."""
    from opforge.profile.resources import decide_for_profile, op_config_resources, ops_config_resources

    x = torch.randn(16, 256)
    soft = decide_for_profile("softmax", (x, -1), "triton_row")
    soft_cfgs = [{"BLOCK_R": 1, "num_warps": 2}, {"BLOCK_R": 4, "num_warps": 4}]
    add = decide_for_profile("add", (x, x), "triton_flat")
    add_cfgs = [{"BLOCK": 1024, "num_warps": 4}]
    together = ops_config_resources([(soft, (x, -1), soft_cfgs), (add, (x, x), add_cfgs)], workers=2)
    assert [len(r) for r in together] == [2, 1]
    alone = op_config_resources(soft, (x, -1), soft_cfgs)
    for got, want in zip(together[0], alone):
        assert [k.to_dict() for k in got] == [k.to_dict() for k in want]
    assert together[1][0][0].kernel.endswith("flat_kernel") and together[1][0][0].num_warps == 4

    sw = S.sweep("softmax", x, -1, variant="triton_row", configs=soft_cfgs, resources=together[0],
                 timer=lambda fn: 1.0)
    assert [r.kernels[0]["constexprs"]["BLOCK_R"] for r in sw.rows] == ["1", "4"]
    with pytest.raises(ValueError, match="2 configs"):
        S.sweep("softmax", x, -1, variant="triton_row", configs=soft_cfgs, resources=together[:1])

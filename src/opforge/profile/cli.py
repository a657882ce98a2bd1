"""``opforge profile OP --shape ... --dtype ...``: what an op runs, compiled
resources and occupancy per config, achieved bandwidth on a GPU, the roofline,
and with ``--ncu`` Nsight Compute's figures; terminal tables plus JSON, HTML
and PNG files."""

from __future__ import annotations

import ast
import json


def add_parser(sub) -> None:
    r = sub.add_parser("profile", help="compiled resources, occupancy, bandwidth per config, ncu metrics of an op")
    r.add_argument("op", nargs="?", help="registry op name, e.g. softmax (or --case)")
    r.add_argument("--shape", help="the first tensor argument's shape, e.g. 4096x4096")
    r.add_argument("--case", help="profile a bench case instead: its inputs, any number of tensors "
                                  "(the case whose 'op label dtype' contains this, e.g. "
                                  "'cross_entropy_fused 8192x32000 fwd+bwd bfloat16')")
    r.add_argument("--dtype", default="bf16", help="fp32, bf16, fp16 or fp64")
    r.add_argument("--arg", action="append", default=[],
                   help="the registry op's further arguments, as Python literals in order (e.g. --arg -1)")
    r.add_argument("--variant", help="force a Triton variant (default: what dispatch picks)")
    r.add_argument("--config", help="the config to profile, as JSON (default: dispatch's)")
    r.add_argument("--no-sweep", action="store_true", help="only the chosen config (no config sweep)")
    r.add_argument("--max-configs", type=int, default=8, help="configs in the sweep (default 8)")
    r.add_argument("--flops", type=float, help="the op's FLOPs for the roofline (default: one per output element)")
    r.add_argument("--ncu", action="store_true", help="run Nsight Compute on the kernel (clocks untouched)")
    r.add_argument("--ncu-timeout", type=float, default=300, help="seconds before ncu is given up")
    r.add_argument("--json", dest="json_path", help="write the report as JSON here")
    r.add_argument("--html", dest="html_path", help="write the report as an HTML page here")
    r.add_argument("--png", dest="png_path", help="write the report's charts as a PNG here")
    r.add_argument("--out", help="write profile-<op>.{json,html,png} into this folder")


def _inputs(args):
    import torch

    from opforge.tune import DTYPES, parse_shape

    if args.dtype not in DTYPES:
        raise ValueError(f"--dtype must be one of {sorted(DTYPES)}, got {args.dtype!r}")
    shape = parse_shape(args.shape)
    dtype = DTYPES[args.dtype]
    if torch.cuda.is_available():
        x = torch.randn(shape, device="cuda", dtype=torch.float32).to(dtype)
    else:
        x = torch.empty(shape, dtype=dtype, device="meta")
    try:
        extra = [ast.literal_eval(a) for a in args.arg]
    except (ValueError, SyntaxError):
        raise ValueError(f"--arg values must be Python literals, got {args.arg}") from None
    return x, extra


def _case_inputs(text: str):
    """(op name, registry args, the case's full name) of a bench case."""
    import torch

    from opforge.bench.harness import case_name, find_case

    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    case = find_case(text, device)
    return case.op, case.registry_args(*case.make_args(device)), case_name(case)


def profile_op(args, console=None) -> tuple[dict, int]:
    """Build the report for parsed ``args``; (report, exit code)."""
    import torch

    from opforge.profile import ncu as ncumod
    from opforge.profile import report as rep_mod
    from opforge.profile.resources import decide_for_profile, op_resources
    from opforge.profile.sweep import sweep

    case = None
    if args.case:
        if args.op or args.shape or args.arg:
            raise ValueError("--case takes the op, shapes and arguments from the bench case: "
                             "give no OP, --shape or --arg with it")
        op_name, inputs, case = _case_inputs(args.case)
        desc = case
    else:
        if not args.op or not args.shape:
            raise ValueError("give an OP and --shape (or --case)")
        x, extra = _inputs(args)
        op_name, inputs = args.op, (x, *extra)
        desc = f"{args.shape} {args.dtype}" + "".join(f" {a}" for a in args.arg)
    config = json.loads(args.config) if args.config else None
    if args.no_sweep or config is not None:
        decision, kernels = op_resources(op_name, *inputs, variant=args.variant, config=config)
        swept = None
    else:
        decision = decide_for_profile(op_name, inputs, args.variant)
        swept = sweep(op_name, *inputs, variant=decision.variant.name, max_configs=args.max_configs,
                      flops=args.flops)
        kernels = None
    ncu_rows, ncu_error, code = None, None, 0
    if args.ncu:
        chosen = next((r for r in swept.rows if r.chosen), None) if swept else None
        names = [k["kernel"] for k in chosen.kernels] if chosen else [k.kernel for k in kernels]
        try:
            if not torch.cuda.is_available():
                raise ncumod.NcuError("--ncu needs a CUDA device: ncu measures a kernel running on a GPU")
            if case is not None:
                job = {"callable": "opforge.profile._ncu_target:case_step",
                       "kwargs": {"case": case, "variant": decision.variant.name, "config": decision.config}}
            else:
                job = {"callable": "opforge.profile._ncu_target:op_step",
                       "kwargs": {"op": decision.op.name, "shape": list(x.shape),
                                  "dtype": str(x.dtype).replace("torch.", ""), "args": extra,
                                  "variant": decision.variant.name, "config": decision.config}}
            ncu_rows = ncumod.run_job(job, names, launches_per_call=len(names), timeout=args.ncu_timeout)
        except ncumod.NcuError as e:
            ncu_error, code = str(e), 1
    rep = rep_mod.op_report(decision, swept, kernels=kernels, ncu_rows=ncu_rows, ncu_error=ncu_error,
                            args_desc=desc)
    return rep, code


def run(args, console) -> int:
    from pathlib import Path

    from opforge import profile
    from opforge.profile import report as rep_mod

    try:
        rep, code = profile_op(args, console)
    except (profile.ProfileError, ValueError, TypeError, KeyError) as e:
        console.print(f"opforge profile: {e}", style="red", markup=False)
        return 1
    rep_mod.print_report(rep, console)
    written = []
    if args.json_path:
        written.append(rep_mod.write_json(rep, args.json_path))
    if args.html_path:
        written.append(rep_mod.write_html(rep, args.html_path))
    if args.png_path:
        written.append(rep_mod.write_png(rep, args.png_path))
    if args.out:
        written += list(rep_mod.write_all(rep, Path(args.out), f"profile-{rep['op'].split('::')[-1]}").values())
    for p in written:
        console.print(f"wrote {p}", markup=False)
    return code

"""``opforge pd``: the placement driver's simulator, service and admin CLI."""

from __future__ import annotations

import argparse
import os

from opforge.placement.token import TokenError, read_token


def add_parser(sub) -> None:
    pd = sub.add_parser("pd", help="the placement driver: simulate, serve, ctl")
    cmds = pd.add_subparsers(dest="pd_command", required=True)

    sim = cmds.add_parser("simulate", help="run simulator cases (PD's pd-simulator)")
    sim.add_argument("--case", action="append", help="case name (repeatable; default: all)")
    sim.add_argument("--list", action="store_true", help="list the cases")
    sim.add_argument("--seed", type=int, default=0)
    sim.add_argument("--plot", help="PNG of per-store counts over time (one case), or a folder (several)")

    serve = cmds.add_parser("serve", help="the HTTP/JSON service (bound to 127.0.0.1 by default)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=2379)
    serve.add_argument("--token-file", help="a file whose first line is the bearer token clients must send "
                       "(default: $OPFORGE_PD_TOKEN)")
    serve.add_argument("--token", help=argparse.SUPPRESS)  # deprecated: visible in ps
    serve.add_argument("--db", default="pd.sqlite", help="SQLite file for cluster metadata")
    serve.add_argument("--max-body-bytes", type=int,
                       help="largest request body accepted; larger ones get 413 (default 128 MiB)")

    ctl = cmds.add_parser("ctl", help="pd-ctl style admin commands against a running service")
    ctl.add_argument("--url", help="service address (or OPFORGE_PD_URL)")
    ctl.add_argument("--token-file", help="a file whose first line is the bearer token (default: $OPFORGE_PD_TOKEN)")
    ctl.add_argument("--token", help=argparse.SUPPRESS)  # deprecated: visible in ps
    ctl.add_argument("-o", "--output", choices=("json", "table"), help="output format (also after the command)")
    ctl.add_argument("rest", nargs=argparse.REMAINDER, help="stores | regions | operators | scheduler add NAME | ...")


def resolve_token(args, command: str = "opforge pd serve") -> str | None:
    """The token from ``--token-file``, the deprecated ``--token`` or
    ``$OPFORGE_PD_TOKEN``; SystemExit with the reason for a bad file."""
    try:
        return read_token(getattr(args, "token", None), getattr(args, "token_file", None), command=command)
    except TokenError as e:
        raise SystemExit(str(e)) from None


def run(args, console) -> int:
    if args.pd_command == "simulate":
        from opforge.placement.simulator import runner

        if args.list:
            for name in runner.list_cases():
                console.print(name)
            return 0
        names = args.case or runner.list_cases()
        results = []
        for name in names:
            plot = None
            if args.plot:
                plot = args.plot if len(names) == 1 else os.path.join(args.plot, f"placement-{name}.png")
                if len(names) > 1:
                    os.makedirs(args.plot, exist_ok=True)
            results.append(runner.run_case(name, seed=args.seed, plot=plot))
        console.print(runner.table(results))
        return 0 if all(r.passed for r in results) else 1
    if args.pd_command == "serve":
        from opforge.placement import service

        extra = {} if args.max_body_bytes is None else {"max_body_bytes": args.max_body_bytes}
        service.serve(host=args.host, port=args.port, token=resolve_token(args), db=args.db, **extra)
        return 0
    if args.pd_command == "ctl":
        from opforge.placement import ctl

        head = (["--url", args.url] if args.url else []) + (["-o", args.output] if args.output else [])
        try:
            token = resolve_token(args, command="opforge pd ctl")
        except SystemExit as e:
            console.print(str(e), markup=False)
            return 2
        return ctl.main(head + args.rest, token=token)
    return 2

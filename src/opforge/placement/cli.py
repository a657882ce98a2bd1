"""``opforge pd``: the placement driver's simulator, service and admin CLI."""

from __future__ import annotations

import argparse
import os


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
    serve.add_argument("--token", default=os.environ.get("OPFORGE_PD_TOKEN"),
                       help="bearer token clients must send (or OPFORGE_PD_TOKEN)")
    serve.add_argument("--db", default="pd.sqlite", help="SQLite file for cluster metadata")

    ctl = cmds.add_parser("ctl", help="pd-ctl style admin commands against a running service")
    ctl.add_argument("--url", help="service address (or OPFORGE_PD_URL)")
    ctl.add_argument("--token", help="bearer token (or OPFORGE_PD_TOKEN)")
    ctl.add_argument("rest", nargs=argparse.REMAINDER, help="stores | regions | operators | scheduler add NAME | ...")


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

        service.serve(host=args.host, port=args.port, token=args.token, db=args.db)
        return 0
    if args.pd_command == "ctl":
        from opforge.placement import ctl

        head = (["--url", args.url] if args.url else []) + (["--token", args.token] if args.token else [])
        return ctl.main(head + args.rest)
    return 2

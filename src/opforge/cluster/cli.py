"""``opforge cluster status``: stores, regions (with their table), leaders and operators in flight
of the cluster running on this host (or ``--url`` / ``--token-file``), as the placement driver
sees them: pd-ctl's tables. Torch-free: the placement client and the endpoint file only."""
from __future__ import annotations

import argparse


def add_parser(sub) -> None:
    c = sub.add_parser("cluster", help="a running opforge cluster: status (stores, regions, leaders, operators)")
    cmds = c.add_subparsers(dest="cluster_command", required=True)
    st = cmds.add_parser("status", help="stores, regions, leaders and operators in flight")
    st.add_argument("--url", help="placement-driver address (default: the cluster started on this host)")
    st.add_argument("--token-file", help="a file whose first line is the bearer token")
    st.add_argument("--token", help=argparse.SUPPRESS)


def _table_names(regions: list[dict], tables: dict[str, int]) -> dict[int, str]:
    by_id = {tid: name for name, tid in tables.items()}
    out = {}
    for r in regions:
        key = r.get("start_key") or ""
        out[r["region_id"]] = by_id.get(int(key[:4], 16), "?") if len(key) >= 4 else "?"
    return out


def run(args, console) -> int:
    from rich.table import Table

    from opforge.cluster import endpoint
    from opforge.placement.cli import resolve_token
    from opforge.placement.client import PDClient, PDError
    from opforge.placement.ctl import _table

    found = endpoint.read()
    url = args.url or (found[0]["url"] if found else None)
    if url is None:
        console.print("opforge cluster status: no cluster is running on this host (no endpoint file under "
                      f"{endpoint.directory()}); pass --url and --token-file", markup=False)
        return 2
    token = None
    if args.token or args.token_file:
        token = resolve_token(args, command="opforge cluster status")
    elif found:
        token = found[1]
    try:
        client = PDClient(url, token)
        stores, ops = client.stores(), client.operators(history=0)
        regions = client.regions(limit=1000)
    except (PDError, ValueError) as e:
        console.print(f"opforge cluster status: {e}", markup=False)
        return 1
    console.print(_table("stores", stores))
    names = _table_names(regions.get("regions", []), found[0].get("tables", {}) if found else {})
    t = Table(title=f"regions ({regions.get('count', 0)})")
    for col in ("region", "table", "leader store", "peers", "epoch", "keys"):
        t.add_column(col)
    for r in regions.get("regions", []):
        peers = ",".join(f"{p['store_id']}{'' if p.get('role', 'voter') == 'voter' else '(' + p['role'] + ')'}"
                         for p in r.get("peers", []))
        e = r.get("epoch", {})
        t.add_row(str(r["region_id"]), names.get(r["region_id"], "?"), str(r.get("leader_store_id")), peers,
                  f"{e.get('conf_ver')}/{e.get('version')}", str(r.get("approximate_keys", "")))
    console.print(t)
    console.print(_table("operators", ops))
    running = len(ops.get("running", [])) + len(ops.get("waiting", []))
    console.print(f"operators in flight: {running}", markup=False)
    return 0

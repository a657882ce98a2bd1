"""pd-ctl style admin commands against a running placement driver service.

    opforge pd ctl [--url URL] [--token-file PATH] [-o json|table] COMMAND ...

    health
    stores                              store ID
    store state ID up|offline|tombstone
    regions [--offset N] [--limit N] [--store ID]
    region ID
    operators                           operator show
    operator add transfer-leader REGION TO_STORE
    operator add add-peer REGION TO_STORE
    operator add remove-peer REGION FROM_STORE
    operator add move-peer REGION FROM_STORE TO_STORE
    operator add split-region REGION
    operator remove REGION
    schedulers                          scheduler show
    scheduler add NAME [KEY=VALUE ...]
    scheduler remove NAME
    config                              config show
    config set NAME VALUE
    rules                               rules show
    rules set FILE                      (a JSON file in the form 'rules show' prints; '-' reads stdin)
    schema

``--url`` defaults to $OPFORGE_PD_URL (else http://127.0.0.1:2379); the token
is read from ``--token-file`` (its first line), else $OPFORGE_PD_TOKEN
(``--token`` still works, deprecated: it shows in ``ps``). Output is JSON, or a rich table with
``-o table`` (the default when printing lists to a terminal). Exit status: 0
done, 1 refused by the service or unreachable, 2 bad usage.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from opforge.placement.client import PDClient, PDError
from opforge.placement.token import ENV as TOKEN_ENV
from opforge.placement.token import TokenError, read_token

USAGE = __doc__.split("\n\n", 2)[1] if __doc__ else ""


class UsageError(Exception):
    pass


def _int(text: str, what: str) -> int:
    try:
        return int(text)
    except (TypeError, ValueError):
        raise UsageError(f"{what} must be an integer, got {text!r}") from None


def _value(text: str) -> Any:
    """KEY=VALUE arguments: JSON when it parses (numbers, lists), else text."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def _split_options(argv: list[str]) -> tuple[dict, list[str]]:
    """Pull the global options out from anywhere in argv."""
    opts: dict[str, Any] = {"url": None, "token": None, "token_file": None, "output": None}
    rest: list[str] = []
    i = 0
    while i < len(argv):
        a = argv[i]
        name, eq, val = a.partition("=")
        if name in ("--url", "--token", "--token-file", "-o", "--output", "--offset", "--limit", "--store"):
            if not eq:
                if i + 1 >= len(argv):
                    raise UsageError(f"{name} needs a value")
                val = argv[i + 1]
                i += 1
            key = {"-o": "output", "--output": "output"}.get(name, name.lstrip("-").replace("-", "_"))
            opts[key] = val
        elif a == "--json":
            opts["output"] = "json"
        elif a == "--table":
            opts["output"] = "table"
        elif a in ("-h", "--help"):
            opts["help"] = True
        elif a == "--":  # `opforge pd ctl -- --url ...` (argparse's REMAINDER keeps it): skip
            pass
        else:
            rest.append(a)
        i += 1
    if opts["output"] not in (None, "json", "table"):
        raise UsageError(f"-o must be json or table, got {opts['output']!r}")
    return opts, rest


def run(client: PDClient, args: list[str], opts: dict) -> tuple[Any, str | None]:
    """Do one command; returns (result, table kind or None)."""
    if not args:
        raise UsageError("no command given")
    cmd, rest = args[0], args[1:]

    def need(n: int, usage: str):
        if len(rest) < n:
            raise UsageError(f"usage: {usage}")

    if cmd == "health":
        return client.health(), None
    if cmd == "schema":
        return client.heartbeat_schema(), None
    if cmd == "stores" or (cmd == "store" and not rest):
        return client.stores(), "stores"
    if cmd == "store":
        if rest[0] == "state":
            need(3, "store state ID up|offline|tombstone")
            return client.set_store_state(_int(rest[1], "store id"), rest[2]), None
        if rest[0] == "delete":  # pd-ctl's name for taking a store offline
            need(2, "store delete ID")
            return client.set_store_state(_int(rest[1], "store id"), "offline"), None
        return client.store(_int(rest[0], "store id")), None
    if cmd == "regions" or (cmd == "region" and not rest):
        store = opts.get("store")
        res = client.regions(offset=_int(opts.get("offset") or 0, "--offset"),
                             limit=_int(opts.get("limit") or 100, "--limit"),
                             store_id=None if store is None else _int(store, "--store"))
        return res, "regions"
    if cmd == "region":
        return client.region(_int(rest[0], "region id")), None
    if cmd == "operators" or (cmd == "operator" and (not rest or rest[0] == "show")):
        return client.operators(), "operators"
    if cmd == "operator":
        sub = rest[0]
        if sub == "add":
            need(3, "operator add KIND REGION [STORE...]")
            kind, region = rest[1], _int(rest[2], "region id")
            stores = [_int(s, "store id") for s in rest[3:]]
            shape = {"transfer-leader": ("to_store",), "add-peer": ("to_store",),
                     "remove-peer": ("from_store",), "move-peer": ("from_store", "to_store"),
                     "split-region": ()}
            if kind not in shape:
                raise UsageError(f"operator add: unknown kind {kind!r}; one of {sorted(shape)}")
            if len(stores) != len(shape[kind]):
                names = " ".join(n.upper() for n in shape[kind])
                raise UsageError(f"usage: operator add {kind} REGION {names}".rstrip())
            return client.add_operator(kind, region, **dict(zip(shape[kind], stores))), None
        if sub in ("remove", "delete", "cancel"):
            need(2, "operator remove REGION")
            return client.remove_operator(_int(rest[1], "region id")), None
        raise UsageError(f"operator: unknown subcommand {sub!r}; add, remove or show")
    if cmd == "schedulers" or (cmd == "scheduler" and (not rest or rest[0] == "show")):
        return client.schedulers(), "schedulers"
    if cmd == "scheduler":
        sub = rest[0]
        if sub == "add":
            need(2, "scheduler add NAME [KEY=VALUE ...]")
            kv = {}
            for item in rest[2:]:
                k, eq, v = item.partition("=")
                if not eq:
                    raise UsageError(f"scheduler add: argument {item!r} is not KEY=VALUE")
                kv[k] = _value(v)
            return client.add_scheduler(rest[1], **kv), None
        if sub in ("remove", "delete"):
            need(2, "scheduler remove NAME")
            return client.remove_scheduler(rest[1]), None
        raise UsageError(f"scheduler: unknown subcommand {sub!r}; add, remove or show")
    if cmd == "config":
        if not rest or rest[0] == "show":
            return client.config(), "config"
        if rest[0] == "set":
            need(3, "config set NAME VALUE")
            return client.set_config({rest[1]: rest[2]}), "config"
        raise UsageError(f"config: unknown subcommand {rest[0]!r}; show or set")
    if cmd == "rules":
        if not rest or rest[0] == "show":
            return client.rules(), None
        if rest[0] in ("set", "load"):
            need(2, "rules set FILE")
            text = sys.stdin.read() if rest[1] == "-" else open(rest[1], encoding="utf-8").read()
            try:
                body = json.loads(text)
            except ValueError as e:
                raise UsageError(f"rules set: {rest[1]} is not JSON: {e}") from None
            return client.set_rules(body), None
        raise UsageError(f"rules: unknown subcommand {rest[0]!r}; show or set")
    raise UsageError(f"unknown command {cmd!r}")


def _table(kind: str, res: Any):
    from rich.table import Table

    if kind == "stores":
        t = Table(title=f"stores ({res.get('count', 0)})")
        for c in ("id", "address", "state", "leaders", "regions", "size MiB", "used", "labels"):
            t.add_column(c, overflow="fold")
        for s in res.get("stores", []):
            state = s.get("state", "") + (" (down)" if s.get("is_down") else "")
            cap = s.get("capacity") or 0
            used = f"{100 * (1 - s.get('available', 0) / cap):.0f}%" if cap else "-"
            labels = ",".join(f"{k}={v}" for k, v in (s.get("labels") or {}).items())
            t.add_row(_cell(s.get("store_id")), _cell(s.get("address")), state, _cell(s.get("leader_count")),
                      _cell(s.get("region_count")), _cell(s.get("region_size")), used, labels)
        return t
    if kind == "regions":
        t = Table(title=f"regions ({len(res.get('regions', []))} of {res.get('count', 0)}, "
                        f"offset {res.get('offset', 0)})")
        for c in ("region_id", "start_key", "end_key", "epoch", "leader_store_id", "peers", "size"):
            t.add_column(c)
        for r in res.get("regions", []):
            e = r.get("epoch", {})
            peers = ",".join(f"{p['store_id']}{'' if p.get('role', 'voter') == 'voter' else '(' + p['role'] + ')'}"
                             for p in r.get("peers", []))
            t.add_row(str(r.get("region_id")), r.get("start_key") or "-inf", r.get("end_key") or "+inf",
                      f"{e.get('conf_ver')}/{e.get('version')}", _cell(r.get("leader_store_id")), peers,
                      _cell(r.get("approximate_size")))
        return t
    if kind == "operators":
        t = Table(title="operators")
        for c in ("", "id", "desc", "region_id", "status", "step", "kind"):
            t.add_column(c)
        for label in ("running", "history"):
            for op in res.get(label, []):
                steps = op.get("steps", [])
                cur = op.get("current_step", 0)
                step = steps[cur]["kind"] if cur < len(steps) else "-"
                t.add_row(label, _cell(op.get("id")), _cell(op.get("desc")), _cell(op.get("region_id")),
                          _cell(op.get("status")), f"{step} ({cur}/{len(steps)})",
                          ",".join(op.get("kind_names", [])))
        return t
    if kind == "schedulers":
        t = Table(title="schedulers")
        t.add_column("name")
        t.add_column("args")
        for n in res.get("schedulers", []):
            t.add_row(n, json.dumps(res.get("args", {}).get(n, {})))
        return t
    if kind == "config":
        t = Table(title="config")
        t.add_column("name")
        t.add_column("value")
        for k, v in res.items():
            t.add_row(k, _cell(v))
        return t
    return None


def _cell(v) -> str:
    if v is None:
        return ""
    if isinstance(v, (dict, list)):
        return json.dumps(v)
    return str(v)


def main(argv: list[str] | None = None, token: str | None = None) -> int:
    """Run one command; ``token`` (if given) is used as is, else read as the
    options say."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        opts, args = _split_options(argv)
    except UsageError as e:
        print(f"opforge pd ctl: {e}", file=sys.stderr)
        return 2
    if opts.get("help") or not args or args[0] == "help":
        print(__doc__.strip())
        return 0 if (opts.get("help") or (args and args[0] == "help")) else 2
    url = opts["url"] or os.environ.get("OPFORGE_PD_URL") or "http://127.0.0.1:2379"
    if token is None:
        try:
            token = read_token(opts["token"], opts["token_file"], command="opforge pd ctl")
        except TokenError as e:
            print(e, file=sys.stderr)
            return 2
    if not token:
        print(f"opforge pd ctl: no token; set {TOKEN_ENV} or pass --token-file PATH", file=sys.stderr)
        return 2
    try:
        client = PDClient(url, token)
        res, kind = run(client, args, opts)
    except UsageError as e:
        print(f"opforge pd ctl: {e}", file=sys.stderr)
        return 2
    except PDError as e:
        print(f"opforge pd ctl: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"opforge pd ctl: {e}", file=sys.stderr)
        return 1
    output = opts["output"] or ("table" if kind and sys.stdout.isatty() else "json")
    table = _table(kind, res) if output == "table" and kind else None
    if table is not None:
        from rich.console import Console

        Console().print(table)
    else:
        print(json.dumps(res, indent=2, sort_keys=False))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())

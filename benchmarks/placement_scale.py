"""Placement driver at scale: heartbeat throughput and scheduling-round time.

    python benchmarks/placement_scale.py [--quick] [--max-regions N] [--out PATH]

Measures

(a) the driver core handling region heartbeats in process (regions/s), split
    into its parts: JSON decode, ``parse_region_heartbeat``,
    ``Driver.handle_region_heartbeat`` on parsed heartbeats, the service's
    batch path (parse + apply + storage bookkeeping) and the SQLite flush; with
    a cProfile of the steady state;
(b) the HTTP service (uvicorn in a child process, bound to 127.0.0.1) through
    the batch endpoint ``POST /pd/api/v1/heartbeat/regions``;
(c) one scheduling round (``Driver.tick``: the schedulers plus the checkers
    over one patrol window) at 10^5 and 10^6 regions, each scheduler and
    checker timed on its own, and the checkers' cost for a full patrol of
    every region.

Writes ``benchmarks/results/placement-scale.json`` and prints a table.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import http.client
import json
import os
import platform
import pstats
import random
import resource
import socket
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "src"))

from opforge.placement.cluster import Peer, Region, RegionEpoch, Store  # noqa: E402
from opforge.placement.driver import Driver  # noqa: E402
from opforge.placement.heartbeat import parse_region_heartbeat  # noqa: E402

GiB = 1 << 30
TOKEN = "bench-token"
PROFILE_N = 20_000  # heartbeats under cProfile (steady state)


def rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def key(i: int) -> bytes:
    return i.to_bytes(5, "big") if i else b""


def make_stores(n: int, zones: int = 3) -> list[Store]:
    return [Store(s, f"gpu{s}", {"zone": f"z{s % zones}", "host": f"h{s}"}, capacity=80 * GiB,
                  available=40 * GiB) for s in range(1, n + 1)]


def region_hb(rid: int, n: int, stores: tuple[int, ...], leader: int, flow: int = 0) -> dict:
    peers = [{"id": rid * 8 + i, "store_id": s, "role": "voter"} for i, s in enumerate(stores)]
    return {"schema_version": 1, "region_id": rid, "start_key": key(rid).hex() if rid > 1 else "",
            "end_key": key(rid + 1).hex() if rid < n else "", "epoch": {"conf_ver": 1, "version": 1},
            "peers": peers, "leader_peer_id": peers[leader]["id"], "approximate_size": 96,
            "approximate_keys": 960_000, "written_bytes": flow * 1024, "read_bytes": flow * 4096,
            "written_keys": flow, "read_keys": flow * 4, "query_num": flow}


def placements(n_regions: int, n_stores: int, rng: random.Random, skew: float = 0.0):
    """Three distinct stores per region; with ``skew`` > 0 the low store ids get more."""
    out = []
    ids = list(range(1, n_stores + 1))
    weights = [1.0 + skew * (n_stores - i) for i in range(n_stores)]
    for _ in range(n_regions):
        if skew:
            chosen = set()
            while len(chosen) < 3:
                chosen.add(rng.choices(ids, weights)[0])
            s = tuple(chosen)
        else:
            s = tuple(rng.sample(ids, 3))
        out.append((s, 0 if skew else rng.randrange(3)))
    return out


def top_profile(prof: cProfile.Profile, n: int = 14) -> list[dict]:
    st = pstats.Stats(prof)
    rows = []
    for (file, line, fn), (cc, nc, tt, ct, _callers) in st.stats.items():
        rows.append({"function": f"{os.path.relpath(file, os.path.join(HERE, '..')) if file.startswith('/') else file}"
                                 f":{line}({fn})", "calls": nc, "tottime_s": round(tt, 4), "cumtime_s": round(ct, 4)})
    rows.sort(key=lambda r: r["tottime_s"], reverse=True)
    return rows[:n]


# --------------------------------------------------------------------------
# (a) the driver core in process
# --------------------------------------------------------------------------

def bench_core(n_regions: int, n_stores: int, rounds: int, tmpdir: str) -> dict:
    from opforge.placement.service import PDService
    from opforge.placement.storage import Storage

    rng = random.Random(1)
    place = placements(n_regions, n_stores, rng)
    hbs = [region_hb(rid, n_regions, s, l, flow=rid % 97) for rid, (s, l) in enumerate(place, start=1)]
    body = json.dumps({"heartbeats": hbs}).encode()
    res: dict = {"regions": n_regions, "stores": n_stores, "body_bytes_per_region": round(len(body) / n_regions)}

    def rate(fn, n=n_regions, reps=rounds):
        best = float("inf")
        for _ in range(reps):
            gc.collect()
            t0 = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t0)
        return round(n / best)

    res["json_decode_per_s"] = rate(lambda: json.loads(body))
    res["parse_per_s"] = rate(lambda: [parse_region_heartbeat(h) for h in hbs])
    parsed = [parse_region_heartbeat(h) for h in hbs]

    d = Driver(schedulers=())
    for s in make_stores(n_stores):
        d.put_store(s)
    t0 = time.perf_counter()
    for hb in parsed:
        d.handle_region_heartbeat(hb)
    res["first_insert_per_s"] = round(n_regions / (time.perf_counter() - t0))
    handle = d.handle_region_heartbeat
    # steady state: the same regions again (metadata unchanged; what 10^5/s mostly is)
    res["apply_parsed_per_s"] = rate(lambda: [handle(hb) for hb in parsed])
    res["parse_and_apply_dicts_per_s"] = rate(lambda: [handle(h) for h in hbs])
    prof = cProfile.Profile()
    prof.enable()
    for h in hbs[:PROFILE_N]:
        handle(h)
    prof.disable()
    res["profile_parse_and_apply"] = top_profile(prof)

    # the service's fast path for heartbeats of known regions with unchanged metadata
    from opforge.placement.service import parse_known_region
    regions = d.cluster.regions
    assert all(parse_known_region(h, regions) is not None for h in hbs)
    res["fast_parse_known_per_s"] = rate(lambda: [parse_known_region(h, regions) for h in hbs])
    fast = [parse_known_region(h, regions) for h in hbs]
    res["fast_parse_and_apply_per_s"] = rate(lambda: [handle(parse_known_region(h, regions)) for h in hbs])
    prof = cProfile.Profile()
    prof.enable()
    for hb in fast[:PROFILE_N]:
        handle(hb)
    prof.disable()
    res["profile_apply_parsed"] = top_profile(prof)

    # the service's batch path with storage (what POST heartbeat/regions runs, minus HTTP)
    db = os.path.join(tmpdir, "core.sqlite")
    d2 = Driver(schedulers=())
    st = Storage(db)
    svc = PDService(d2, st, tick_interval=0)
    for s in make_stores(n_stores):
        d2.put_store(s)
    t0 = time.perf_counter()
    svc.region_heartbeats(hbs)
    st.flush()
    res["service_batch_first_insert_with_storage_per_s"] = round(n_regions / (time.perf_counter() - t0))
    res["service_batch_steady_per_s"] = rate(lambda: svc.region_heartbeats(hbs))
    res["service_batch_steady_incl_json_decode_per_s"] = rate(
        lambda: svc.region_heartbeats(json.loads(body)["heartbeats"]))
    # storage alone: every region's metadata changed (leader moved), one flush
    st.batch_size = 1 << 62
    for rid, (s, l) in enumerate(place, start=1):
        hb = parsed[rid - 1].region
        st.save_region(hb.clone(leader=hb.peers[(l + 1) % 3]))
    t0 = time.perf_counter()
    st.flush()
    res["storage_flush_changed_regions_per_s"] = round(n_regions / (time.perf_counter() - t0))
    t0 = time.perf_counter()
    d3 = Driver(schedulers=())
    rep = Storage(db).load_into(d3, attach=False)
    res["storage_reload_s"] = round(time.perf_counter() - t0, 3)
    res["storage_reload_regions"] = rep.regions
    st.close()
    return res


# --------------------------------------------------------------------------
# (b) the HTTP service
# --------------------------------------------------------------------------

SERVER = r"""
import sys, uvicorn
from opforge.placement.driver import Driver
from opforge.placement.service import create_app
from opforge.placement.storage import Storage
app = create_app(Driver(schedulers=()), Storage(sys.argv[2]), token=sys.argv[3], tick_interval=1.0)
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", access_log=False)
"""


def bench_http(n_regions: int, n_stores: int, batch: int, seconds: float, tmpdir: str, clients: int) -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    db = os.path.join(tmpdir, "http.sqlite")
    env = dict(os.environ, PYTHONPATH=os.path.join(HERE, "..", "src"))
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(port), db, TOKEN], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}

    def call(conn, method, path, body=None):
        conn.request(method, "/pd/api/v1/" + path, body=body, headers=headers)
        r = conn.getresponse()
        data = r.read()
        if r.status != 200:
            raise RuntimeError(f"{method} {path}: {r.status} {data[:200]!r}")
        return json.loads(data)

    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
                call(conn, "GET", "health")
                break
            except (OSError, RuntimeError):
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("service did not start: " + (proc.stderr.read().decode()[-2000:]
                                                                    if proc.poll() is not None else "timeout"))
                time.sleep(0.1)
        for st in make_stores(n_stores):
            call(conn, "POST", "stores", json.dumps({"store_id": st.id, "address": st.address, "labels": st.labels,
                                                     "capacity": st.capacity, "available": st.available}).encode())
        rng = random.Random(2)
        place = placements(n_regions, n_stores, rng)
        bodies = []
        for i in range(0, n_regions, batch):
            hbs = [region_hb(rid, n_regions, *place[rid - 1]) for rid in range(i + 1, min(i + batch, n_regions) + 1)]
            bodies.append((len(hbs), json.dumps({"heartbeats": hbs}).encode()))
        t0 = time.perf_counter()
        for n, b in bodies:
            call(conn, "POST", "heartbeat/regions", b)
        first = n_regions / (time.perf_counter() - t0)
        # single-heartbeat endpoint, one connection, for comparison
        single = [json.dumps(region_hb(rid, n_regions, *place[rid - 1])).encode() for rid in range(1, 2001)]
        t0 = time.perf_counter()
        for b in single:
            call(conn, "POST", "heartbeat/region", b)
        single_rate = len(single) / (time.perf_counter() - t0)
        conn.close()
        # steady state: `clients` keep-alive connections sending pre-built requests for
        # `seconds` (a raw-socket client, so the client's cost stays out of the figure:
        # http.client alone spends ~20 ms sending a 2 MB body here, curl ~6 ms)
        done = [0] * clients
        stop = time.monotonic() + seconds
        errors = []
        auth = f"Authorization: Bearer {TOKEN}\r\n".encode()
        requests = [(n, b"POST /pd/api/v1/heartbeat/regions HTTP/1.1\r\nHost: 127.0.0.1\r\n" + auth +
                     b"Content-Type: application/json\r\nContent-Length: " + str(len(b)).encode() + b"\r\n\r\n" + b)
                    for n, b in bodies]

        def sender(k):
            sk = socket.create_connection(("127.0.0.1", port), timeout=60)
            sk.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            f = sk.makefile("rb")
            j = k
            try:
                while time.monotonic() < stop:
                    n, req = requests[j % len(requests)]
                    sk.sendall(req)
                    status = f.readline()
                    length = 0
                    while True:
                        line = f.readline()
                        if line in (b"\r\n", b""):
                            break
                        if line.lower().startswith(b"content-length:"):
                            length = int(line.split(b":")[1])
                    f.read(length)
                    if b" 200 " not in status:
                        raise RuntimeError(status)
                    done[k] += n
                    j += clients
            except Exception as e:  # noqa: BLE001
                errors.append(repr(e))
            finally:
                f.close()
                sk.close()

        t0 = time.perf_counter()
        threads = [threading.Thread(target=sender, args=(k,)) for k in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(seconds + 120)
        elapsed = time.perf_counter() - t0
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        health = call(conn, "GET", "health")
        conn.close()
        return {"regions": n_regions, "batch": batch, "clients": clients,
                "first_insert_per_s": round(first), "steady_batch_per_s": round(sum(done) / elapsed),
                "single_endpoint_per_s": round(single_rate), "seconds": round(elapsed, 2),
                "server_heartbeats": health.get("heartbeats"), "server_regions": health.get("regions"),
                "errors": errors[:3]}
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


# --------------------------------------------------------------------------
# (c) one scheduling round at scale
# --------------------------------------------------------------------------

def build_cluster(n_regions: int, n_stores: int, seed: int = 3) -> Driver:
    """Put the regions straight into the cluster (in key order), skewed so the
    schedulers find work: low store ids hold more regions and every leader."""
    from opforge.placement import schedulers as registry

    d = Driver(schedulers=())
    names = _scheduler_names(registry)
    for name in names:
        args = {"store_ids": [n_stores]} if name == "evict-leader" else {}
        try:
            d.add_scheduler(name, **args)
        except Exception as e:  # noqa: BLE001
            print(f"  (scheduler {name} not added: {e})")
    for s in make_stores(n_stores):
        d.put_store(s)
    rng = random.Random(seed)
    cluster = d.cluster
    ids = list(range(1, n_stores + 1))
    weights = [1.0 + 2.0 * (n_stores - i) / n_stores for i in range(n_stores)]
    cum = []
    acc = 0.0
    for w in weights:
        acc += w
        cum.append(acc)
    import bisect as _b
    epoch = RegionEpoch(1, 1)
    for rid in range(1, n_regions + 1):
        chosen: list[int] = []
        while len(chosen) < 3:
            s = ids[_b.bisect_left(cum, rng.random() * acc)]
            if s not in chosen:
                chosen.append(s)
        peers = tuple(Peer(rid * 8 + i, s) for i, s in enumerate(chosen))
        leader = min(peers, key=lambda p: p.store_id)
        size = 64 + (rid % 7) * 8 if rid % 50 else 4  # a few small regions for the merge checker
        cluster.put_region(Region(rid, key(rid) if rid > 1 else b"", key(rid + 1) if rid < n_regions else b"",
                                  epoch, peers, leader, approximate_size=size, approximate_keys=size * 10_000,
                                  written_bytes=(rid % 1000) * 4096))
    d.ids.advance_past(n_regions * 8 + 8)
    return d


def _scheduler_names(registry) -> list[str]:
    return sorted(registry.SCHEDULERS)


def bench_round(n_regions: int, n_stores: int, ticks: int) -> dict:
    gc.collect()
    t0 = time.perf_counter()
    d = build_cluster(n_regions, n_stores)
    build_s = time.perf_counter() - t0
    res: dict = {"regions": n_regions, "stores": n_stores, "build_s": round(build_s, 2),
                 "schedulers": sorted(d.schedulers), "checkers": [type(c).__name__ for c in d.checkers],
                 "patrol_regions_per_tick": d.config.patrol_regions_per_tick}
    gc.collect()
    gc.freeze()  # the cluster is long-lived: keep the cyclic GC from rescanning it (as a service would)
    # each part on its own, on a fresh context (no operators yet)
    now = d.clock()
    parts = {}
    for name, sch in d.schedulers.items():
        ctx = d.context(now)
        t0 = time.perf_counter()
        ops = sch.schedule(ctx)
        parts[f"scheduler {name}"] = {"ms": round((time.perf_counter() - t0) * 1e3, 2), "operators": len(ops)}
    window = d._patrol_window()
    d._patrol_cursor = 0
    for chk in d.checkers:
        ctx = d.context(now)
        t0 = time.perf_counter()
        n_ops = 0
        for r in window:
            n_ops += len(chk.check(r, ctx) or ())
        parts[f"checker {type(chk).__name__} ({len(window)} regions)"] = {
            "ms": round((time.perf_counter() - t0) * 1e3, 2), "operators": n_ops}
    t0 = time.perf_counter()
    d.context(now)
    parts["context()"] = {"ms": round((time.perf_counter() - t0) * 1e3, 2)}
    t0 = time.perf_counter()
    d._patrol_window()
    parts["_patrol_window()"] = {"ms": round((time.perf_counter() - t0) * 1e3, 2)}
    d._patrol_cursor = 0
    res["parts"] = parts
    # whole rounds
    times = []
    added = []
    prof = cProfile.Profile()
    for i in range(ticks):
        t0 = time.perf_counter()
        if i == ticks - 1:
            prof.enable()
        ops = d.tick()
        if i == ticks - 1:
            prof.disable()
        times.append((time.perf_counter() - t0) * 1e3)
        added.append(len(ops))
    # the default schedulers only (what a fresh Driver() runs)
    from opforge.placement.driver import DEFAULT_SCHEDULERS
    for name in list(d.schedulers):
        if name not in DEFAULT_SCHEDULERS:
            d.remove_scheduler(name)
    dtimes = []
    for i in range(3):
        t0 = time.perf_counter()
        d.tick()
        dtimes.append((time.perf_counter() - t0) * 1e3)
    res["default_schedulers"] = sorted(d.schedulers)
    res["tick_ms_default_schedulers"] = [round(t, 1) for t in dtimes]
    res["tick_ms"] = [round(t, 1) for t in times]
    res["tick_ms_median"] = round(sorted(times)[len(times) // 2], 1)
    res["operators_added_per_tick"] = added
    res["running_operators"] = len(d.controller.running())
    res["profile_last_tick"] = top_profile(prof, 12)
    # checkers over every region once (a full patrol), per region
    sample = list(d.cluster.regions.values())[: min(n_regions, 50_000)]
    ctx = d.context()
    for chk in d.checkers:  # once-per-tick work (e.g. cluster-wide sums) is not per region
        chk.check(sample[0], ctx)
    t0 = time.perf_counter()
    for r in sample:
        for chk in d.checkers:
            if chk.check(r, ctx):
                break
    per = (time.perf_counter() - t0) / len(sample)
    res["checkers_us_per_region"] = round(per * 1e6, 2)
    res["full_patrol_s_estimate"] = round(per * n_regions, 2)
    res["ticks_per_full_patrol"] = -(-n_regions // d.config.patrol_regions_per_tick)
    res["rss_mib"] = round(rss_mib())
    gc.unfreeze()
    del d
    gc.collect()
    return res


# --------------------------------------------------------------------------

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    ap.add_argument("--max-regions", type=int, default=1_000_000, help="largest cluster for (c)")
    ap.add_argument("--core-regions", type=int, default=100_000)
    ap.add_argument("--http-seconds", type=float, default=8.0)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "placement-scale.json"))
    ap.add_argument("--skip", action="append", default=[], choices=["core", "http", "round"])
    a = ap.parse_args(argv)
    if a.quick:
        a.core_regions, a.max_regions, a.http_seconds = 10_000, 20_000, 2.0
    out: dict = {"host": {"python": platform.python_version(), "machine": platform.machine(),
                          "cpus": os.cpu_count(), "platform": platform.platform()},
                 "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
    with tempfile.TemporaryDirectory(prefix="pd-bench-") as tmp:
        if "core" not in a.skip:
            print(f"(a) driver core, {a.core_regions} regions ...", flush=True)
            t0 = time.perf_counter()
            out["core"] = bench_core(a.core_regions, 32, 2, tmp)
            out["core"]["bench_s"] = round(time.perf_counter() - t0, 1)
        if "http" not in a.skip:
            print("(b) HTTP batch endpoint ...", flush=True)
            try:
                t0 = time.perf_counter()
                out["http"] = bench_http(min(a.core_regions, 100_000), 32, 5000, a.http_seconds, tmp,
                                         clients=2)
                out["http"]["bench_s"] = round(time.perf_counter() - t0, 1)
            except Exception as e:  # noqa: BLE001
                out["http"] = {"error": repr(e)}
        if "round" not in a.skip:
            out["round"] = []
            sizes = [s for s in (100_000, 1_000_000) if s <= a.max_regions] or [a.max_regions]
            for n in sizes:
                print(f"(c) one scheduling round at {n} regions ...", flush=True)
                try:
                    t0 = time.perf_counter()
                    out["round"].append(bench_round(n, 32, ticks=5))
                    out["round"][-1]["bench_s"] = round(time.perf_counter() - t0, 1)
                except MemoryError:
                    out["round"].append({"regions": n, "error": "MemoryError"})
                    break
    out["notes"] = notes(out)
    out["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(out, f, indent=2)
    print_table(out)
    print(f"\nwritten {a.out}")
    return 0


def notes(out: dict) -> list[str]:
    """Where the time goes, in words, from the figures measured."""
    n = []
    core = out.get("core") or {}
    if core.get("parse_per_s") and core.get("fast_parse_known_per_s"):
        n.append(f"(a) parse_region_heartbeat: {core['parse_per_s']:,}/s; the service's fast path for known, "
                 f"unchanged regions: {core['fast_parse_known_per_s']:,}/s.")
    for r in out.get("round", []):
        parts = r.get("parts") or {}
        top = sorted(parts.items(), key=lambda kv: -kv[1].get("ms", 0))[:3]
        n.append(f"(c) {r['regions']:,} regions: tick median {r.get('tick_ms_median')} ms; largest parts: "
                 + "; ".join(f"{k} {v['ms']} ms" for k, v in top))
    return n


def print_table(out: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="placement driver at scale")
    t.add_column("measure")
    t.add_column("value", justify="right")
    t.add_column("target", justify="right")
    core = out.get("core") or {}
    for k, label in [("json_decode_per_s", "JSON decode of a batch"),
                     ("parse_per_s", "parse_region_heartbeat"),
                     ("apply_parsed_per_s", "Driver.handle_region_heartbeat (parsed, steady)"),
                     ("parse_and_apply_dicts_per_s", "Driver.handle_region_heartbeat (dicts, steady)"),
                     ("fast_parse_known_per_s", "service fast parse (known, unchanged regions)"),
                     ("fast_parse_and_apply_per_s", "fast parse + Driver.handle_region_heartbeat"),
                     ("first_insert_per_s", "first insert (new regions)"),
                     ("service_batch_steady_per_s", "service batch path + storage (steady)"),
                     ("service_batch_steady_incl_json_decode_per_s", "  ... incl. JSON decode"),
                     ("storage_flush_changed_regions_per_s", "SQLite flush of changed regions")]:
        if k in core:
            t.add_row(f"(a) {label}", f"{core[k]:,} regions/s", ">= 100,000/s" if "steady" in k else "")
    http = out.get("http") or {}
    if "steady_batch_per_s" in http:
        t.add_row(f"(b) HTTP batch endpoint ({http['batch']}/request, {http['clients']} clients)",
                  f"{http['steady_batch_per_s']:,} regions/s", "")
        t.add_row("(b) HTTP single-heartbeat endpoint", f"{http['single_endpoint_per_s']:,} req/s", "")
    elif http:
        t.add_row("(b) HTTP", str(http.get("error")), "")
    for r in out.get("round", []):
        if "tick_ms_median" in r:
            t.add_row(f"(c) one tick at {r['regions']:,} regions (median of {len(r['tick_ms'])})",
                      f"{r['tick_ms_median']} ms", "<= 100 ms" if r["regions"] >= 1_000_000 else "")
            dm = r.get("tick_ms_default_schedulers") or []
            if dm:
                t.add_row(f"(c)   default schedulers only ({', '.join(r['default_schedulers'])})",
                          f"{sorted(dm)[len(dm) // 2]} ms", "")
            t.add_row(f"(c)   full patrol of checkers at {r['regions']:,}", f"{r['full_patrol_s_estimate']} s", "")
        else:
            t.add_row(f"(c) {r['regions']:,} regions", str(r.get("error")), "")
    Console().print(t)


if __name__ == "__main__":
    raise SystemExit(main())

"""The placement driver's HTTP service, against a real uvicorn server on loopback.

Each test starts the server in a background thread on 127.0.0.1 and a port
the OS picked (every wait bounded), and talks to it with the worker client
(``placement.client``), raw urllib, or ``ctl.main``.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")

from opforge.placement import ctl  # noqa: E402
from opforge.placement.client import HeartbeatLoop, PDError  # noqa: E402
from opforge.placement.driver import Driver  # noqa: E402
from opforge.placement.heartbeat import HeartbeatError, parse_region_heartbeat  # noqa: E402
from opforge.placement.service import API, create_app, parse_known_region, serve  # noqa: E402
from opforge.placement.storage import Storage  # noqa: E402
from pd_live_server import TOKEN, Server, raw  # noqa: E402

GiB = 1 << 30


def _store(sid, zone=None):
    return {"store_id": sid, "address": f"gpu{sid}", "labels": {"zone": zone or f"z{sid}"},
            "capacity": 100 * GiB, "available": 80 * GiB}


def _key(i):
    return i.to_bytes(4, "big").hex() if i else ""


def _region(rid, stores=(1, 2, 3), leader=1, conf_ver=1, version=1, size=64, peer_base=None, last=None):
    base = rid * 10 if peer_base is None else peer_base
    peers = [{"id": base + s, "store_id": s, "role": "voter"} for s in stores]
    return {"schema_version": 1, "region_id": rid, "start_key": _key(rid), "end_key": _key(rid + 1) if
            last is None or rid < last else "", "epoch": {"conf_ver": conf_ver, "version": version},
            "peers": peers, "leader_peer_id": base + leader, "approximate_size": size, "approximate_keys": 1000}


_raw = raw


def _cluster(c, n_stores=3, n_regions=30, leader=1):
    for s in range(1, n_stores + 1):
        c.register_store(_store(s))
    for rid in range(1, n_regions + 1):
        c.region_heartbeat(_region(rid, stores=(1, 2, 3), leader=leader, last=n_regions))


# --------------------------------------------------------------------------

def test_every_request_needs_the_bearer_token():
    with Server() as srv:
        for path in ("health", "stores", "schema/heartbeat", "config"):
            status, body = _raw(f"{srv.url}{API}/{path}", token=None)
            assert status == 401 and "authorization" in body["error"].lower()
            status, body = _raw(f"{srv.url}{API}/{path}", token="wrong")
            assert status == 401
        status, _ = _raw(f"{srv.url}{API}/heartbeat/region", "POST", _region(1), token="x" * 200)
        assert status == 401
        assert not srv.driver.cluster.regions  # nothing got through
        status, body = _raw(f"{srv.url}{API}/health")
        assert status == 200 and body["status"] == "ok"
        with pytest.raises(PDError) as e:
            srv.client("nope").stores()
        assert e.value.status == 401


def test_openapi_spec_lists_the_heartbeat_and_admin_paths_behind_the_token():
    with Server(tick_interval=0) as srv:
        status, _ = _raw(f"{srv.url}{API}/openapi.json", token=None)
        assert status == 401
        status, spec = _raw(f"{srv.url}{API}/openapi.json")
        assert status == 200 and spec["openapi"].startswith("3.")
        for path in ("heartbeat/store", "heartbeat/region", "heartbeat/regions", "stores", "operators",
                     "schedulers", "config", "rules"):
            assert f"{API}/{path}" in spec["paths"], path


def test_schema_is_versioned_and_describes_both_heartbeats():
    with Server(tick_interval=0) as srv:
        schema = srv.client().heartbeat_schema()
        assert schema["schema_version"] == 1
        region = schema["region_heartbeat"]
        assert {"region_id", "epoch", "peers", "leader_peer_id"} <= set(region["required"])
        assert region["$id"].endswith("/v1")
        assert "capacity" in schema["store_heartbeat"]["required"]


def test_concurrent_clients_register_and_heartbeat():
    n_threads, per_thread = 8, 40
    with Server(tick_interval=0.05) as srv:
        c = srv.client()
        for s in range(1, 5):
            c.register_store(_store(s))

        def worker(t):
            cl = srv.client()
            out = []
            for i in range(per_thread):
                rid = t * per_thread + i + 1
                out.append(cl.region_heartbeat(_region(rid, stores=(1, 2, 3), leader=1 + rid % 3)))
            cl.store_heartbeat(_store(1 + t % 4))
            return out

        t0 = time.monotonic()
        with ThreadPoolExecutor(n_threads) as pool:
            results = [f.result(timeout=30) for f in [pool.submit(worker, t) for t in range(n_threads)]]
        assert time.monotonic() - t0 < 30
        answers = [r for rs in results for r in rs]
        assert len(answers) == n_threads * per_thread
        assert all(set(r) == {"region_id", "operator_id", "step"} for r in answers)
        regions = c.regions(limit=1000)
        assert regions["count"] == n_threads * per_thread
        assert c.health()["refused_heartbeats"] == 0
        # paging covers every region exactly once
        seen, offset = set(), 0
        while offset is not None:
            page = c.regions(offset=offset, limit=97)
            seen |= {r["region_id"] for r in page["regions"]}
            offset = page["next_offset"]
        assert seen == set(range(1, n_threads * per_thread + 1))
        st = c.store(1)
        assert st["region_count"] == n_threads * per_thread and st["leader_count"] > 0


def test_heartbeat_responses_carry_steps_once_schedulers_propose_operators():
    with Server(tick_interval=0.05) as srv:
        c = srv.client()
        _cluster(c, n_stores=3, n_regions=30, leader=1)  # store 1 leads everything
        deadline = time.monotonic() + 15
        step_resp = None
        while step_resp is None and time.monotonic() < deadline:
            for rid in range(1, 31):
                r = c.region_heartbeat(_region(rid, leader=1, last=30))
                if r["step"] is not None:
                    step_resp = r
                    break
            else:
                time.sleep(0.05)
        assert step_resp is not None, f"no step within 15 s; operators: {c.operators()}"
        step = step_resp["step"]
        assert step["kind"] == "TransferLeader" and step["from_store"] == 1 and step["to_store"] in (2, 3)
        ops = c.operators()
        assert any(op["region_id"] == step_resp["region_id"] for op in ops["running"])
        # the leader does it; the next heartbeat shows it and the operator ends SUCCESS
        rid = step_resp["region_id"]
        done = c.region_heartbeat(_region(rid, leader=step["to_store"], last=30))
        assert done["step"] is None
        hist = c.operators()["history"]
        assert any(op["region_id"] == rid and op["status"] == "success" for op in hist)

        # batches carry steps too: an admin operator on a region nobody touched
        target = next(i for i in range(1, 31) if i != rid and c.region(i)["operator"] is None)
        c.add_operator("transfer-leader", target, to_store=3)
        got = c.region_heartbeats([_region(i, leader=1, last=30) for i in range(1, 31)])
        assert got["accepted"] == 30 and got["refused"] == 0
        mine = [s for s in got["steps"] if s["region_id"] == target]
        assert mine and mine[0]["step"] == {"kind": "TransferLeader", "from_store": 1, "to_store": 3}


def test_malformed_input_is_refused_with_the_field_named_and_the_server_keeps_serving():
    with Server(tick_interval=0.05) as srv:
        c = srv.client()
        _cluster(c, n_regions=3)
        url = f"{srv.url}{API}/heartbeat/region"
        good = _region(1, last=3)
        cases = [
            (dict(good, epoch={"conf_ver": "x", "version": 1}), "conf_ver"),
            ({k: v for k, v in good.items() if k != "peers"}, "peers"),
            (dict(good, leader_peer_id=424242), "leader_peer_id"),
            (dict(good, region_id=-3), "region_id"),
            (dict(good, start_key="zz"), "start_key"),
            (dict(good, peers=[{"id": 11, "store_id": 99}], leader_peer_id=11), "unknown store 99"),
            (dict(good, down_peers=[{"a": 1}]), "down_peers"),
            (dict(good, schema_version=7), "schema_version"),
            ([1, 2, 3], "JSON object"),
        ]
        for body, needle in cases:
            status, resp = _raw(url, "POST", body)
            assert status == 400, (body, resp)
            assert needle in resp["error"], (needle, resp)
        status, resp = _raw(url, "POST", raw_body=b"{not json")
        assert status == 400 and "not valid JSON" in resp["error"]
        status, resp = _raw(f"{srv.url}{API}/heartbeat/store", "POST", {"store_id": 1, "capacity": 1,
                                                                          "available": 5})
        assert status == 400 and "available" in resp["error"]
        status, resp = _raw(f"{srv.url}{API}/heartbeat/store", "POST", _store(77))
        assert status == 400 and "not registered" in resp["error"]
        status, resp = _raw(f"{srv.url}{API}/stores/abc")
        assert status == 400 and "store_id" in resp["error"]
        status, resp = _raw(f"{srv.url}{API}/config", "PUT", {"max_replicas": "many"})
        assert status == 400 and "max_replicas" in resp["error"]
        status, resp = _raw(f"{srv.url}{API}/config", "PUT", {"no_such_item": 1})
        assert status == 400 and "no_such_item" in resp["error"]
        status, resp = _raw(f"{srv.url}{API}/rules", "PUT", {"rules": [{"group_id": "pd", "id": "x"}]})
        assert status == 400 and "missing field" in resp["error"]
        status, resp = _raw(f"{srv.url}{API}/operators", "POST", {"kind": "fly", "region_id": 1})
        assert status == 400 and "fly" in resp["error"]
        status, resp = _raw(f"{srv.url}{API}/regions/999")
        assert status == 404
        # a batch: the bad ones are named by index, the good ones applied
        got = c.region_heartbeats([_region(2, last=3), dict(good, epoch=None), _region(3, last=3)])
        assert got["accepted"] == 2 and got["refused"] == 1
        assert got["errors"][0]["index"] == 1 and "epoch" in got["errors"][0]["error"]
        # still serving, state intact
        assert c.region_heartbeat(good)["region_id"] == 1
        h = c.health()
        assert h["status"] == "ok" and h["regions"] == 3 and h["refused_heartbeats"] >= 8
        assert c.config()["max_replicas"] == 3


def test_restart_on_the_same_database_keeps_everything(tmp_path):
    db = tmp_path / "pd.sqlite"
    rules = {"rules": [{"group_id": "pd", "id": "default", "role": "voter", "count": 3,
                        "location_labels": ["zone"]},
                       {"group_id": "gpu", "id": "learner", "role": "learner", "count": 1,
                        "start_key": "00000010", "end_key": "00000020"}],
             "groups": [{"id": "gpu", "index": 1, "override": False}]}
    with Server(db=db, tick_interval=0.05) as srv:
        c = srv.client()
        _cluster(c, n_stores=4, n_regions=40)
        c.set_store_state(4, "offline")
        c.set_config({"leader_schedule_limit": 7, "location_labels": "zone", "max_store_down_time": 45.5})
        c.remove_scheduler("hot-region")
        c.add_scheduler("evict-leader", store_ids=[2])
        c.set_rules(rules)
        # split region 40 (the last) into 40 and 41; then merge 39 away into 38
        c.region_heartbeat(dict(_region(40, version=2), end_key=_key(40) + "80"))
        c.region_heartbeat(dict(_region(41, version=2, last=41), start_key=_key(40) + "80"))
        c.region_heartbeat(dict(_region(38, version=3), end_key=_key(40)))  # covers 39
        # an admin add-peer allocates a peer id that no heartbeat has reported yet
        c.add_operator("remove-peer", 6, from_store=3)
        c.set_store_state(4, "up")
        op = c.add_operator("add-peer", 7, to_store=4)
        allocated = op["steps"][0]["peer_id"]
        before = {"stores": c.stores(), "regions": c.regions(limit=1000), "config": c.config(),
                  "schedulers": c.schedulers()["schedulers"], "rules": c.rules()}
        c.set_store_state(4, "offline")
        before["stores"] = c.stores()
    assert before["regions"]["count"] == 40  # 39 merged away, 41 split off

    with Server(db=db, tick_interval=0.05) as srv:
        c = srv.client()
        assert srv.svc.load_report.regions == 40 and srv.svc.load_report.stores == 4
        stores = c.stores()
        assert [s["store_id"] for s in stores["stores"]] == [1, 2, 3, 4]
        assert {s["store_id"]: s["state"] for s in stores["stores"]} == {1: "up", 2: "up", 3: "up", 4: "offline"}
        assert {s["store_id"]: s["labels"] for s in stores["stores"]} == \
            {s["store_id"]: s["labels"] for s in before["stores"]["stores"]}
        regions = c.regions(limit=1000)
        assert regions["count"] == 40
        strip = lambda rs: sorted((r["region_id"], r["start_key"], r["end_key"], json.dumps(r["epoch"]),
                                   json.dumps(r["peers"]), r["leader_peer_id"]) for r in rs["regions"])
        assert strip(regions) == strip(before["regions"])
        assert 39 not in {r["region_id"] for r in regions["regions"]}
        assert c.config() == before["config"]
        assert c.config()["leader_schedule_limit"] == 7 and c.config()["location_labels"] == ["zone"]
        assert c.schedulers()["schedulers"] == before["schedulers"]
        assert "hot-region" not in before["schedulers"] and "evict-leader" in before["schedulers"]
        assert c.schedulers()["args"]["evict-leader"] == {"store_ids": [2]}
        assert c.rules() == before["rules"]
        assert any(r["group_id"] == "gpu" for r in c.rules()["rules"])
        # the peer-id high-water mark survived: new peers never reuse an allocated id
        c.set_store_state(4, "up")
        op = c.add_operator("add-peer", 9, to_store=4)
        assert op["steps"][0]["peer_id"] > allocated
        # the old region 38 replaced 39: a heartbeat for 39's range with the old version is refused
        with pytest.raises(PDError) as e:
            c.region_heartbeat(_region(39))
        assert e.value.status == 400


def test_ctl_commands_against_the_live_server(capsys, monkeypatch):
    with Server(tick_interval=0.05) as srv:
        c = srv.client()
        _cluster(c, n_stores=4, n_regions=10)
        base = ["--url", srv.url, "--token", TOKEN]

        def run(*argv, code=0):
            rc = ctl.main([*base, *argv])
            out, err = capsys.readouterr()
            assert rc == code, (argv, out, err)
            return json.loads(out) if rc == 0 and out.strip().startswith(("{", "[")) else (out, err)

        assert [s["store_id"] for s in run("stores")["stores"]] == [1, 2, 3, 4]
        assert run("regions", "--limit", "5")["count"] == 10
        assert len(run("regions", "--limit", "5")["regions"]) == 5
        assert run("region", "3")["region_id"] == 3
        assert "running" in run("operators")
        assert "balance-region" in run("scheduler", "show")["schedulers"]
        assert "evict-leader" in run("scheduler", "add", "evict-leader", "store_ids=[2]")["schedulers"]
        assert "evict-leader" not in run("scheduler", "remove", "evict-leader")["schedulers"]
        assert run("config", "set", "region_schedule_limit", "99")["region_schedule_limit"] == 99
        assert run("store", "state", "4", "offline")["state"] == "offline"
        assert run("store", "state", "4", "up")["state"] == "up"
        op = run("operator", "add", "move-peer", "5", "3", "4")
        assert op["region_id"] == 5 and [s["kind"] for s in op["steps"]][0] == "AddLearner"
        ops_now = run("operators")  # running, or queued behind store 4's add-peer limit
        assert any(o["region_id"] == 5 for o in ops_now["running"] + ops_now["waiting"]), ops_now
        assert run("operator", "remove", "5")["status"] == "canceled"
        # errors: refused (1), bad usage (2); pd-ctl text on stderr
        _, err = run("config", "set", "max_replicas", "lots", code=1)
        assert "max_replicas" in err
        _, err = run("operator", "add", "transfer-leader", "5", code=2)
        assert "usage" in err
        _, err = run("stores", "--token", "bad", code=1)
        assert "401" in err
        monkeypatch.setenv("OPFORGE_PD_URL", srv.url)
        monkeypatch.setenv("OPFORGE_PD_TOKEN", TOKEN)
        assert ctl.main(["-o", "table", "stores"]) == 0
        out, _ = capsys.readouterr()
        assert "gpu1" in out and "address" in out and "zone=z4" in out


def test_heartbeat_loop_hands_steps_to_the_executor():
    with Server(tick_interval=0) as srv:  # no background ticks: only the admin operator runs
        c = srv.client()
        for s in (1, 2, 3):
            c.register_store(_store(s))
        regions = {rid: _region(rid, last=5) for rid in range(1, 6)}

        class Worker:
            def __init__(self):
                self.steps = []

            def execute(self, region_id, operator_id, step):
                self.steps.append((region_id, operator_id, step))
                if step["kind"] == "TransferLeader":  # do it: the next heartbeat shows it
                    r = regions[region_id]
                    r["leader_peer_id"] = next(p["id"] for p in r["peers"] if p["store_id"] == step["to_store"])

        worker = Worker()
        loop = HeartbeatLoop(c, lambda: _store(1), lambda: list(regions.values()), worker,
                             interval=0.02, batch_size=2)
        loop.run_once()
        assert worker.steps == []
        op = c.add_operator("transfer-leader", 4, to_store=2)
        loop.start()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not any(h["status"] == "success" for h in c.operators()["history"]):
            time.sleep(0.02)
        loop.stop()
        assert worker.steps and worker.steps[0][:2] == (4, op["id"])
        assert worker.steps[0][2] == {"kind": "TransferLeader", "from_store": 1, "to_store": 2}
        assert c.region(4)["leader_store_id"] == 2
        assert loop.failures == 0 and loop.refused == 0


def test_serve_refuses_to_start_without_a_token(monkeypatch):
    monkeypatch.delenv("OPFORGE_PD_TOKEN", raising=False)
    with pytest.raises(SystemExit, match="token"):
        serve(port=0, token=None)
    with pytest.raises(ValueError, match="token"):
        create_app(Driver(), token="")


def test_fast_parse_of_known_regions_matches_the_parser_or_defers_to_it():
    known_hb = dict(_region(7, size=64), down_peers=[], written_bytes=5)
    known = parse_region_heartbeat(known_hb).region
    regions = {7: known}
    variants = [
        known_hb, dict(known_hb, written_bytes=999, approximate_size=3, query_num=4),
        {k: v for k, v in known_hb.items() if k not in ("written_bytes", "schema_version", "down_peers")},
        dict(known_hb, leader_peer_id=72), dict(known_hb, epoch={"conf_ver": 2, "version": 1}),
        dict(known_hb, epoch={"conf_ver": True, "version": 1}), dict(known_hb, written_bytes=True),
        dict(known_hb, written_bytes=-1), dict(known_hb, written_bytes=1.5), dict(known_hb, down_peers=[71]),
        dict(known_hb, pending_peers={}), dict(known_hb, start_key="00"), dict(known_hb, schema_version=2),
        dict(known_hb, peers=list(reversed(known_hb["peers"]))),
        dict(known_hb, peers=[dict(known_hb["peers"][0], role="learner")] + known_hb["peers"][1:]),
        dict(known_hb, peers=[dict(known_hb["peers"][0], id=71.0)] + known_hb["peers"][1:]),
        dict(known_hb, region_id=8), [known_hb],
    ]
    fast_hits = 0
    for d in variants:
        fast = parse_known_region(d, regions)
        try:
            slow = parse_region_heartbeat(d).region
        except (HeartbeatError, TypeError):
            slow = None
        if fast is not None:
            fast_hits += 1
            assert slow is not None and fast.region == slow, d
    assert fast_hits == 3


def test_storage_writes_only_changed_regions_in_batches_and_reloads_them(tmp_path):
    from opforge.placement.storage import PEER_ID_RESERVE, StorageError, _stored_region, region_to_json

    db = tmp_path / "s.sqlite"
    st = Storage(db, batch_size=1000)
    d = Driver(schedulers=())
    st.load_into(d)
    for s in (1, 2, 3):
        d.put_store(parse_store(_store(s)))
    for rid in range(1, 101):
        d.handle_region_heartbeat(_region(rid, last=100))
    st.flush()
    assert st.regions_written == 100 and st.counts() == {"stores": 3, "regions": 100}
    for rid in range(1, 101):  # flow changes only: nothing to write
        d.handle_region_heartbeat(dict(_region(rid, last=100), written_bytes=rid))
    st.flush()
    assert st.regions_written == 100
    d.handle_region_heartbeat(_region(5, leader=2))  # leader moved: written
    d.handle_region_heartbeat(dict(_region(98, version=2), end_key=_key(100)))  # merged 99 in: 99 deleted
    st.flush()
    assert st.regions_written == 102 and st.counts()["regions"] == 99
    allocated = d.ids()
    st.close()

    d2 = Driver(schedulers=())
    st2 = Storage(db)
    rep = st2.load_into(d2)
    assert rep.regions == 99 and rep.stores == 3 and 99 not in d2.cluster.regions
    assert d2.cluster.regions[5].leader.store_id == 2 and d2.cluster.regions[98].end_key == bytes.fromhex(_key(100))
    meta = lambda c: {r.id: (r.start_key, r.end_key, r.epoch, r.peers, r.leader, r.approximate_size)
                      for r in c.regions.values()}
    assert meta(d2.cluster) == meta(d.cluster)  # flow figures are not history: not rewritten
    assert d2.ids() > allocated and rep.peer_id_hwm >= allocated
    assert d2.cluster.region_for_key(bytes.fromhex(_key(42))).id == 42
    st2.close()

    # the quick row decoder agrees with the parser, and defers to it off the beaten path
    r = d.cluster.regions[7]
    assert _stored_region(region_to_json(r)) == r
    learner = dict(region_to_json(r), peers=[dict(p, role="learner") if i == 2 else p
                                             for i, p in enumerate(region_to_json(r)["peers"])])
    assert _stored_region(learner) == parse_region_heartbeat(learner).region
    assert _stored_region(dict(region_to_json(r), down_peers=[71])) is None
    assert _stored_region(dict(region_to_json(r), approximate_size="9")) is None

    # a damaged row is refused with its id named
    import sqlite3
    con = sqlite3.connect(db)
    con.execute("UPDATE regions SET data = ? WHERE id = 3", ('{"region_id": 3, "epoch": 5}',))
    con.commit()
    con.close()
    with pytest.raises(StorageError, match="row 3"):
        Storage(db).load_into(Driver(schedulers=()))
    assert PEER_ID_RESERVE > 0


def parse_store(d):
    from opforge.placement.heartbeat import parse_store_heartbeat

    return parse_store_heartbeat(d).store

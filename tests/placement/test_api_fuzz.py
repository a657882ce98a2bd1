"""Property-based fuzzing of the HTTP API from its own OpenAPI document
(Schemathesis), against a live server on loopback with a token.

Every operation gets a bounded number of generated requests, valid ones
(by the schema) and invalid ones; each answer must not be a server error and
must match the schema documented for its status. The server is seeded with a
few stores and regions so that requests reach past "not found"."""

from __future__ import annotations

import time

import pytest

schemathesis = pytest.importorskip("schemathesis")
pytest.importorskip("uvicorn")

from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis.errors import Unsatisfiable  # noqa: E402
from schemathesis import GenerationMode  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.specs.openapi.checks import response_schema_conformance  # noqa: E402

from opforge.placement.service import API  # noqa: E402
from pd_live_server import TOKEN, Server  # noqa: E402

AUTH = {"Authorization": f"Bearer {TOKEN}"}
EXAMPLES = {GenerationMode.POSITIVE: 10, GenerationMode.NEGATIVE: 5}
BUDGET_S = 75.0


def _seed(client):
    for s in (1, 2, 3):
        client.register_store({"store_id": s, "address": f"gpu{s}", "capacity": 1 << 40, "available": 1 << 39})
    for rid in range(1, 6):
        peers = [{"id": rid * 10 + s, "store_id": s} for s in (1, 2, 3)]
        client.region_heartbeat({"region_id": rid, "start_key": f"{rid:02x}" if rid > 1 else "",
                                 "end_key": f"{rid + 1:02x}" if rid < 5 else "", "epoch": {"conf_ver": 1, "version": 1},
                                 "peers": peers, "leader_peer_id": rid * 10 + 1})


def test_every_endpoint_survives_schema_driven_fuzzing():
    t0 = time.monotonic()
    with Server(tick_interval=0.2) as srv:
        _seed(srv.client())
        schema = schemathesis.openapi.from_url(f"{srv.url}{API}/openapi.json", headers=AUTH, timeout=10)
        operations = [result.ok() for result in schema.get_all_operations()]
        assert len(operations) >= 20, [op.label for op in operations]
        failures = []
        for op in operations:
            for mode, n in EXAMPLES.items():
                @settings(max_examples=n, deadline=None, database=None, derandomize=True,
                          phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
                @given(case=op.as_strategy(generation_mode=mode))
                def check(case):
                    case.call_and_validate(base_url=srv.url, headers=AUTH, timeout=10,
                                           checks=[not_a_server_error, response_schema_conformance])

                try:
                    check()
                except Unsatisfiable:  # negative mode, an operation with no input to get wrong
                    assert mode is GenerationMode.NEGATIVE, op.label
                except Exception as e:  # collect them all, report together
                    failures.append(f"{op.label} ({mode.value}): {type(e).__name__}: {str(e)[:2000]}")
            assert time.monotonic() - t0 < BUDGET_S, f"fuzzing ran past {BUDGET_S} s at {op.label}"
        assert not failures, "\n\n".join(failures)
        assert srv.svc.tick_errors == 0, srv.svc.last_tick_error

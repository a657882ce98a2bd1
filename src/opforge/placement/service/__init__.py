"""The placement driver as an HTTP/JSON service (FastAPI, served by uvicorn).

Workers send store and region heartbeats; each region heartbeat is answered
with the step its leader should run now (or none). Admins read and change the
cluster through the same API (``opforge pd ctl``). Endpoints live under
``/pd/api/v1``::

    POST   heartbeat/store              a store heartbeat
    POST   heartbeat/region             a region heartbeat -> {"region_id", "operator_id", "step"}
    POST   heartbeat/regions            a batch {"heartbeats": [...]} -> {"accepted", "steps", "errors"}
    POST   stores                       register a store (a worker joining)
    GET    stores | stores/{id}
    POST   stores/{id}/state            {"state": "up" | "offline" | "tombstone"}
    GET    regions?offset=&limit=&store_id=
    GET    regions/{id}
    GET    operators                    running operators and recent history
    POST   operators                    {"kind", "region_id", "to_store"?, "from_store"?}
    DELETE operators/{region_id}
    GET    schedulers | POST schedulers {"name", "args"?} | DELETE schedulers/{name}
    GET    config | PUT config {name: value, ...}
    GET    rules | PUT rules
    GET    schema/heartbeat             the versioned JSON Schema of the heartbeat messages
    GET    health

Every request needs ``Authorization: Bearer <token>`` (401 otherwise; the
token is compared in constant time). Bad input is answered 400 with a message
that names the field; the driver is not disturbed. One lock serializes every
use of the driver; a background thread runs ``driver.tick()`` every
``tick_interval`` seconds and flushes the storage.

The package holds one concern per module: ``schema`` (the published JSON
Schemas and API limits), ``errors``, ``auth`` (bearer tokens), ``parsing``
(request parsing, the heartbeat fast path), ``facade`` (``PDService``: the
state and operations, usable without HTTP), ``routes`` (``create_app``) and
``server`` (``serve``). Everything is re-exported here.
"""

from __future__ import annotations

from opforge.placement.service.auth import BearerAuth
from opforge.placement.service.errors import _INPUT_ERRORS, BadRequest
from opforge.placement.service.facade import BATCH_LOCK_CHUNK, PDService
from opforge.placement.service.parsing import (
    _diagnose_region, _parse_region, _require, _rid, gc_paused, parse_known_region,
)
from opforge.placement.service.routes import create_app
from opforge.placement.service.schema import (
    API, MAX_BATCH, MAX_PAGE, REGION_HEARTBEAT_BATCH_SCHEMA, REGION_HEARTBEAT_RESPONSE_SCHEMA,
    REGION_HEARTBEAT_SCHEMA, STORE_HEARTBEAT_SCHEMA, heartbeat_schema,
)
from opforge.placement.service.server import _is_loopback, serve

__all__ = [
    "API", "MAX_BATCH", "MAX_PAGE", "BATCH_LOCK_CHUNK", "STORE_HEARTBEAT_SCHEMA", "REGION_HEARTBEAT_SCHEMA",
    "REGION_HEARTBEAT_BATCH_SCHEMA", "REGION_HEARTBEAT_RESPONSE_SCHEMA", "heartbeat_schema", "BadRequest",
    "BearerAuth", "PDService", "parse_known_region", "gc_paused", "create_app", "serve",
]

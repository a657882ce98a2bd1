"""What the OpenAPI document (``GET openapi.json``) says of each route's JSON
bodies: the request schema and the schemas of its answers. The routes read
raw bodies (the fast heartbeat path parses them itself), so FastAPI cannot
infer these; Schemathesis fuzzes the service from them."""

from __future__ import annotations

from opforge.placement.cluster import StoreState
from opforge.placement.config import config_schema
from opforge.placement.heartbeat import MAX_UINT64
from opforge.placement.service.schema import (
    REGION_HEARTBEAT_BATCH_SCHEMA, REGION_HEARTBEAT_RESPONSE_SCHEMA, REGION_HEARTBEAT_SCHEMA, STORE_HEARTBEAT_SCHEMA,
    _uint,
)

ERROR_SCHEMA = {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}}
OBJECT = {"type": "object"}
_ERRORS = {"400": "bad input (the message names the field)", "401": "missing or wrong bearer token",
           "404": "no such store, region, operator or scheduler", "413": "request body too large",
           "500": "could not be saved (nothing changed)"}


def _bare(schema: dict) -> dict:
    """A JSON Schema without its document-level keys, to embed in OpenAPI."""
    return {k: v for k, v in schema.items() if k not in ("$schema", "$id")}


STORE_REGISTRATION_SCHEMA = {**_bare(STORE_HEARTBEAT_SCHEMA), "title": "StoreRegistration",
                             "required": ["store_id"],
                             "description": "a store joining; capacity and available default to 0 and capacity"}
STORE_STATE_SCHEMA = {"type": "object", "required": ["state"],
                      "properties": {"state": {"enum": [s.value for s in StoreState]}}}
OPERATOR_SCHEMA = {"type": "object", "required": ["kind", "region_id"],
                   "properties": {"kind": {"enum": ["transfer-leader", "add-peer", "remove-peer", "move-peer",
                                                    "split-region"]},
                                  "region_id": _uint(), "to_store": _uint(), "from_store": _uint()}}
SCHEDULER_SCHEMA = {"type": "object", "required": ["name"],
                    "properties": {"name": {"type": "string", "maxLength": 64}, "args": {"type": "object"}}}
_CONSTRAINT = {"type": "object", "required": ["key", "op"],
               "properties": {"key": {"type": "string", "maxLength": 256},
                              "op": {"enum": ["in", "notIn", "exists", "notExists"]},
                              "values": {"type": "array", "maxItems": 64,
                                         "items": {"type": "string", "maxLength": 256}}}}
_INDEX = {"type": "integer", "minimum": -(2 ** 31), "maximum": 2 ** 31 - 1}
RULES_SCHEMA = {
    "type": "object",
    "properties": {
        "rules": {"type": "array", "maxItems": 64, "items": {
            "type": "object", "required": ["group_id", "id", "role", "count"],
            "properties": {"group_id": {"type": "string", "maxLength": 64}, "id": {"type": "string", "maxLength": 64},
                           "index": _INDEX, "override": {"type": "boolean"},
                           "start_key": {"type": "string", "pattern": "^([0-9a-fA-F]{2})*$", "maxLength": 512},
                           "end_key": {"type": "string", "pattern": "^([0-9a-fA-F]{2})*$", "maxLength": 512},
                           "role": {"enum": ["voter", "leader", "follower", "learner"]},
                           "count": {"type": "integer", "minimum": 1, "maximum": 255},
                           "label_constraints": {"type": "array", "maxItems": 16, "items": _CONSTRAINT},
                           "location_labels": {"type": "array", "maxItems": 16,
                                               "items": {"type": "string", "maxLength": 256}},
                           "isolation_level": {"type": "string", "maxLength": 256}}}},
        "groups": {"type": "array", "maxItems": 64, "items": {
            "type": "object", "required": ["id"],
            "properties": {"id": {"type": "string", "maxLength": 64}, "index": _INDEX,
                           "override": {"type": "boolean"}}}},
    },
}
BATCH_RESPONSE_SCHEMA = {
    "type": "object", "required": ["accepted", "refused", "steps", "errors"],
    "properties": {"accepted": _uint(), "refused": _uint(),
                   "steps": {"type": "array", "items": _bare(REGION_HEARTBEAT_RESPONSE_SCHEMA)},
                   "errors": {"type": "array", "items": {
                       "type": "object", "required": ["index", "error"],
                       "properties": {"index": _uint(), "error": {"type": "string"},
                                      "region_id": {}}}}},
}
STORE_HEARTBEAT_RESPONSE_SCHEMA = {"type": "object", "required": ["store_id", "state"],
                                   "properties": {"store_id": _uint(),
                                                  "state": {"enum": [s.value for s in StoreState]}}}
HEALTH_SCHEMA = {"type": "object", "required": ["status", "stores", "regions"],
                 "properties": {"status": {"const": "ok"}, "stores": _uint(), "regions": _uint()}}


def doc(request: dict | None = None, response: dict | None = None) -> dict:
    """``openapi_extra`` of a route: its JSON request body (if any) and the
    schemas of its 200 and error answers."""
    out: dict = {"responses": {
        "200": {"description": "done", "content": {"application/json": {"schema": response or OBJECT}}},
        **{code: {"description": text, "content": {"application/json": {"schema": ERROR_SCHEMA}}}
           for code, text in _ERRORS.items()},
    }}
    if request is not None:
        out["requestBody"] = {"required": True, "content": {"application/json": {"schema": request}}}
    return out


DOCS = {
    "store_heartbeat": doc(_bare(STORE_HEARTBEAT_SCHEMA), STORE_HEARTBEAT_RESPONSE_SCHEMA),
    "region_heartbeat": doc(_bare(REGION_HEARTBEAT_SCHEMA), _bare(REGION_HEARTBEAT_RESPONSE_SCHEMA)),
    "region_heartbeats": doc(_bare(REGION_HEARTBEAT_BATCH_SCHEMA), BATCH_RESPONSE_SCHEMA),
    "register_store": doc(STORE_REGISTRATION_SCHEMA),
    "store_state": doc(STORE_STATE_SCHEMA),
    "add_operator": doc(OPERATOR_SCHEMA),
    "add_scheduler": doc(SCHEDULER_SCHEMA),
    "put_config": doc(config_schema()),
    "put_rules": doc(RULES_SCHEMA),
    "health": doc(None, HEALTH_SCHEMA),
}
ID_LIMITS = {"ge": 0, "le": MAX_UINT64}

"""The published JSON Schemas of the service's messages (versioned with
``heartbeat.SCHEMA_VERSION``) and the API's fixed limits."""

from __future__ import annotations

from opforge.placement.cluster import PeerRole, StoreState
from opforge.placement.heartbeat import MAX_ADDRESS_LEN, MAX_LABEL_LEN, MAX_LABELS, MAX_UINT64, SCHEMA_VERSION


API = "/pd/api/v1"
MAX_BATCH = 200_000  # region heartbeats in one batch request
MAX_PAGE = 10_000  # regions in one page


def _uint(desc: str = "") -> dict:
    """An unsigned 64-bit integer (ids and figures, as in PD)."""
    d: dict = {"type": "integer", "minimum": 0, "maximum": MAX_UINT64}
    if desc:
        d["description"] = desc
    return d


_HEX = {"type": "string", "pattern": "^([0-9a-fA-F]{2})*$"}

STORE_HEARTBEAT_SCHEMA: dict = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": f"opforge:pd/store-heartbeat/v{SCHEMA_VERSION}",
    "title": "StoreHeartbeat",
    "description": "What a worker (store) reports about itself, every few seconds.",
    "type": "object",
    "required": ["store_id", "capacity", "available"],
    "properties": {
        "schema_version": {"const": SCHEMA_VERSION},
        "store_id": _uint(),
        "address": {"type": "string", "maxLength": MAX_ADDRESS_LEN},
        "labels": {"type": "object", "maxProperties": MAX_LABELS,
                   "propertyNames": {"maxLength": MAX_LABEL_LEN},
                   "additionalProperties": {"type": "string", "maxLength": MAX_LABEL_LEN}},
        "state": {"enum": [s.value for s in StoreState],
                  "description": "ignored in heartbeats: the administrative state is the driver's"},
        "capacity": _uint("bytes given to data"),
        "available": _uint("bytes free; must not exceed capacity"),
        "used_size": _uint("bytes used (default capacity - available)"),
        "region_count": _uint(),
        "sending_snap_count": _uint(),
        "receiving_snap_count": _uint(),
        "is_busy": {"type": "boolean"},
        "bytes_written": _uint(), "bytes_read": _uint(), "keys_written": _uint(), "keys_read": _uint(),
        "query_num": _uint(),
    },
}

REGION_HEARTBEAT_SCHEMA: dict = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": f"opforge:pd/region-heartbeat/v{SCHEMA_VERSION}",
    "title": "RegionHeartbeat",
    "description": "What a region's leader reports; answered with the step to run now.",
    "type": "object",
    "required": ["region_id", "epoch", "peers", "leader_peer_id"],
    "properties": {
        "schema_version": {"const": SCHEMA_VERSION},
        "region_id": _uint(),
        "start_key": {**_HEX, "description": "hex; empty = -infinity"},
        "end_key": {**_HEX, "description": "hex; empty = +infinity; must sort after start_key"},
        "epoch": {"type": "object", "required": ["conf_ver", "version"],
                  "properties": {"conf_ver": _uint("bumped by membership changes"),
                                 "version": _uint("bumped by splits and merges")}},
        "peers": {"type": "array", "minItems": 1,
                  "description": "distinct peer ids on distinct stores",
                  "items": {"type": "object", "required": ["id", "store_id"],
                            "properties": {"id": _uint(), "store_id": _uint(),
                                           "role": {"enum": [r.value for r in PeerRole], "default": "voter"}}}},
        "leader_peer_id": {**_uint(), "description": "a voter among peers"},
        "approximate_size": _uint("MiB"),
        "approximate_keys": _uint(),
        "written_bytes": _uint(), "read_bytes": _uint(), "written_keys": _uint(), "read_keys": _uint(),
        "query_num": _uint(),
        "down_peers": {"type": "array", "items": _uint(), "description": "peer ids of the region"},
        "pending_peers": {"type": "array", "items": _uint(), "description": "peer ids of the region"},
    },
}

_STEP_SCHEMA = {
    "type": ["object", "null"],
    "description": "the step the leader should run now; 'kind' names it (TransferLeader, AddLearner, "
                   "PromoteLearner, RemovePeer, AddPeer, ChangePeerV2Enter, ChangePeerV2Leave, SplitRegion, "
                   "MergeRegion), the other fields are its arguments",
    "required": ["kind"],
    "properties": {"kind": {"type": "string"}},
}

REGION_HEARTBEAT_RESPONSE_SCHEMA: dict = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": f"opforge:pd/region-heartbeat-response/v{SCHEMA_VERSION}",
    "title": "RegionHeartbeatResponse",
    "type": "object",
    "required": ["region_id", "operator_id", "step"],
    "properties": {"region_id": _uint(),
                   "operator_id": {"type": ["integer", "null"], "minimum": 0, "maximum": MAX_UINT64},
                   "step": _STEP_SCHEMA},
}

REGION_HEARTBEAT_BATCH_SCHEMA: dict = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": f"opforge:pd/region-heartbeat-batch/v{SCHEMA_VERSION}",
    "title": "RegionHeartbeatBatch",
    "description": f"up to {MAX_BATCH} region heartbeats; answered with the steps of the regions that have one "
                   "and the refused heartbeats by index",
    "type": "object",
    "required": ["heartbeats"],
    "properties": {"heartbeats": {"type": "array", "maxItems": MAX_BATCH, "items": REGION_HEARTBEAT_SCHEMA}},
}


def heartbeat_schema() -> dict:
    return {
        "schema_version": SCHEMA_VERSION,
        "store_heartbeat": STORE_HEARTBEAT_SCHEMA,
        "region_heartbeat": REGION_HEARTBEAT_SCHEMA,
        "region_heartbeat_batch": REGION_HEARTBEAT_BATCH_SCHEMA,
        "region_heartbeat_response": REGION_HEARTBEAT_RESPONSE_SCHEMA,
    }

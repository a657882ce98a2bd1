"""The errors the service answers with a 4xx status."""

from __future__ import annotations

from opforge.placement.heartbeat import HeartbeatError


class BadRequest(Exception):
    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


# What malformed input can raise while being parsed or applied. TypeError is
# here because parse_region_heartbeat lets some (unhashable peer ids in
# down_peers, for instance) escape as TypeError rather than HeartbeatError.
_INPUT_ERRORS = (HeartbeatError, ValueError, TypeError, KeyError)

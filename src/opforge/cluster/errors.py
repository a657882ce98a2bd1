"""Errors of the cluster: what a caller may retry, and what it should not."""
from __future__ import annotations


class ClusterError(RuntimeError):
    """The cluster cannot do what was asked (not started, stopped, a region with no live replica)."""


class RetryableError(ClusterError):
    """A query failed because a worker died, or failed alone (not by the query's own error), while it
    ran. The coordinator recovers (re-forms the group, promotes replicas) before the next call, so
    running the query again is expected to work."""

    retryable = True

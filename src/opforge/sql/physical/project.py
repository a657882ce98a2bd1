"""Projection: evaluate each output expression over the input batch."""
from __future__ import annotations

from opforge.sql.expr import Batch, evaluate
from opforge.sql.plan import Project


def run_project(node: Project, batch: Batch) -> Batch:
    return Batch({o.cid: evaluate(e, batch) for o, e in node.exprs}, batch.n, batch.device)

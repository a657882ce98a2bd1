"""Admission of records to event-time windows: every record needs a
timestamp; records past the allowed lateness are dropped (counted) or go to
the late-data side output."""

from __future__ import annotations

from opforge.stream.records import NO_TIMESTAMP, Batch


def require_timestamps(batch: Batch, where: str) -> None:
    if len(batch) and bool((batch.timestamps == NO_TIMESTAMP).any()):
        raise ValueError(f"{where}: a record has no timestamp; event-time windows need a "
                         "WatermarkStrategy with a timestamp assigner on the source")


class LateData:
    """Drop or side-output records past the allowed lateness; counts drops."""

    def __init__(self, op, tag):
        self.op, self.tag, self.dropped = op, tag, 0

    def handle(self, batch: Batch) -> None:
        if len(batch) == 0:
            return
        if self.tag is None:
            self.dropped += len(batch)
        else:
            self.op.out.emit_side(self.tag, batch.with_keys(None))

"""Timestamps and watermarks assigned by a ``WatermarkStrategy``: at a source
(``_SourceRunner``) or mid-stream (``DataStream.assign_timestamps_and_watermarks``,
Flink's ``TimestampsAndWatermarksOperator``, here ``TimestampsOperator``).

The mid-stream operator stamps each record with the strategy's assigner and
makes its own watermarks (per record with ``watermark_granularity="record"``,
else after each batch); watermarks from upstream are dropped except the end
of input's, as in Flink.
"""

from __future__ import annotations

import torch

from opforge.stream.operators import Operator
from opforge.stream.records import NO_TIMESTAMP, Batch
from opforge.stream.time import MAX_WATERMARK, WatermarkGenerator, WatermarkStrategy


def stamp(strategy: WatermarkStrategy, batch: Batch, prev_ts: int, where: str) -> tuple[Batch, int]:
    """The batch with the strategy's timestamps, and the last one (a callable
    assigner gets the record and its timestamp so far, Flink's ``record_timestamp``)."""
    a = strategy.timestamp_assigner
    if a is None or len(batch) == 0:
        return batch, prev_ts
    if isinstance(a, str):
        col = batch.columns.get(a)
        if not isinstance(col, torch.Tensor) or col.dtype.is_floating_point or col.dtype == torch.bool:
            raise ValueError(f"{where}: timestamp column {a!r} must be an integer column "
                             f"(fields: {list(batch.columns)})")
        return batch.with_timestamps(col.to(torch.int64)), prev_ts
    extract = getattr(a, "extract_timestamp", a)
    out = []
    prev = prev_ts
    for r, t in zip(batch.records(), batch.timestamps.tolist()):
        prev = int(extract(r, t))
        out.append(prev)
    return batch.with_timestamps(torch.tensor(out, dtype=torch.int64, device=batch.device)), prev


class TimestampsOperator(Operator):
    record_watermarks = True

    def __init__(self, name, strategy: WatermarkStrategy, per_record: bool):
        super().__init__(name)
        self.strategy, self.per_record = strategy, per_record

    def open(self):
        self.wmgen = WatermarkGenerator(self.strategy, self.name)
        self.prev_ts = NO_TIMESTAMP

    def process_batch(self, batch):
        batch, self.prev_ts = stamp(self.strategy, batch.with_keys(None), self.prev_ts, self.name)
        if self.per_record:
            batch = batch.with_watermarks(self.wmgen.record_watermarks(batch.timestamps),
                                          torch.arange(len(batch), device=batch.device))
        else:
            batch = Batch(batch.columns, batch.timestamps, batch.schema, meta=dict(batch.meta))
        self.wmgen.on_batch(batch.timestamps)
        self.out.emit(batch)
        wm = self.wmgen.current()
        if wm is not None:
            self.out.emit_watermark(wm)

    def on_watermark(self, watermark):
        if watermark == MAX_WATERMARK:  # the end of the input fires what is left
            self.watermark = watermark
            self.out.emit_watermark(watermark)

    def snapshot_state(self) -> dict:
        return {"prev_ts": self.prev_ts, "max_ts": self.wmgen.max_ts, "emitted": self.wmgen.emitted}

    def restore_state(self, s: dict) -> None:
        self.prev_ts, self.wmgen.max_ts, self.wmgen.emitted = s["prev_ts"], s["max_ts"], s["emitted"]

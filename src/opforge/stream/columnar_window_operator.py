"""``ColumnarWindowOperator``: one table row per (key, window), for sliding
windows whose size is not a multiple of the slide; and
``columnar_window_operator``, which picks the columnar operator for an
assigner (panes when the size is a multiple of the slide)."""

from __future__ import annotations

import torch

from opforge.stream.columnar_windows import ColumnarWindows
from opforge.stream.functions import Aggregations
from opforge.stream.grouping import nonzero_known
from opforge.stream.paned_window_operator import PanedWindowOperator
from opforge.stream.records import NO_TIMESTAMP, Batch
from opforge.stream.triggers import fire_mask


class ColumnarWindowOperator(ColumnarWindows):
    """One table row per (key, window): each record goes into each of its
    windows (sliding windows whose size is not a multiple of the slide)."""

    layout = "windows"

    def _process_run(self, batch, wm):
        """Records that see the watermark ``wm`` (an int, or one per record
        when no window end passes among them: ``ColumnarWindows.process_batch``)."""
        n = len(batch)
        if n == 0:
            return
        self._batch_no += 1
        ts = batch.timestamps
        rows, starts, ends = self.assigner.assign(ts)
        keys = batch.keys.index_select(0, rows)
        wm_pair = wm.index_select(0, rows) if isinstance(wm, torch.Tensor) else wm
        max_ts = ends - 1
        kept = max_ts + self.lateness > wm_pair
        # the trigger's on_element over the pairs: one that fires goes in and fires its window alone
        fires = fire_mask(self.trigger.on_element_batch(max_ts, wm_pair))
        on_time = kept & ~fires
        # Flink: a record is late when none of its windows took it and it is
        # past the lateness (its side output), not merely when one window is late
        placed = torch.zeros(n, dtype=torch.int32, device=self.device) \
            .index_add_(0, rows, kept.to(torch.int32)) > 0
        row_late = ~placed & (ts + self.lateness <= wm)
        m = rows.shape[0]
        # the batch's shape in one read-back: missing timestamps, late rows,
        # kept / on-time pairs, key and window-start ranges (and the table's)
        parts = [(ts == NO_TIMESTAMP).sum(), row_late.sum(), kept.sum(), on_time.sum()]
        if m:
            parts += [keys.min(), keys.max(), starts.min(), starts.max()]
        stats = self._stats(parts, batch)
        if stats[0]:
            raise ValueError(f"{self.name}: a record has no timestamp; event-time windows need a "
                             "WatermarkStrategy with a timestamp assigner on the source")
        n_late, n_kept, n_on = stats[1], stats[2], stats[3]
        bounds = tuple(stats[4:8]) if m else None
        if n_late:
            self.late.handle(batch.select(row_late))
        cols, dtypes = self._values(batch, rows)
        if n_on:
            if n_on == m:  # the usual case: every pair on time, no selection
                self._fold_batch(keys, starts, cols, dtypes, bounds)
            else:
                idx = nonzero_known(on_time, n_on)
                self._fold_batch(keys.index_select(0, idx), starts.index_select(0, idx),
                                 {name: c.index_select(0, idx) for name, c in cols.items()}, dtypes, bounds)
        if n_kept > n_on:
            late_fire = nonzero_known(kept & fires, n_kept - n_on)
            self._late_firings(late_fire, keys, starts, cols, dtypes, bounds)
        self._enforce_budget()

    def _late_firings(self, pairs_idx, keys, starts, cols, dtypes, bounds):
        """Each late record updates its window and fires it (Flink's per-record late firing)."""
        fired = []
        for i in pairs_idx.tolist():
            slot = self._slots(keys[i:i + 1], starts[i:i + 1], dtypes, bounds)
            self._fold(slot, torch.ones(1, dtype=torch.int64, device=self.device),
                       {n: c[i:i + 1] for n, c in cols.items()})
            fired.append(self._results(slot))  # the window as it is now
        self.out.emit(Batch.concat(fired))

    def _results(self, slots: torch.Tensor) -> Batch:
        return self._window_batch(self.t_key[slots], self.t_start[slots], self.t_count[slots],
                                  {n: a[slots] for n, a in self.t_acc.items()})

    def _advance(self, watermark):
        before, self.watermark = self.watermark, watermark
        last = self.assigner.size - 1  # a window's last timestamp: start + size - 1
        # rows whose window's timers are due fire now (ends in (before, watermark]); cold ones come back first
        after, upto = self.trigger.fire_range(before, watermark)
        self._take_cold(lambda s: (s + last > after) & (s + last <= upto),
                        lambda lo, hi: hi + last > after and lo + last <= upto)
        gone, n_gone = None, 0
        if self.t_key.shape[0]:
            end_ts = self.t_start + last
            due = fire_mask(self.trigger.on_event_time_batch(end_ts, before, watermark))
            gone = end_ts + self.lateness <= watermark
            n_due, n_gone = torch.stack([due.sum(), gone.sum()]).tolist()  # the one host sync
            if n_due:
                slots = nonzero_known(due, n_due)
                if self.cold is not None:  # restored rows sit at the end: order by first appearance
                    slots = slots[torch.argsort(self.t_seq[slots])]
                order = torch.argsort(end_ts[slots], stable=True)
                self.out.emit(self._results(slots[order]))
        self._forget(gone, n_gone, watermark)


def columnar_window_operator(name, assigner, agg: Aggregations, key_selector, allowed_lateness=0,
                             late_tag=None) -> ColumnarWindows:
    """The columnar operator for ``Aggregations`` over event-time sliding (or
    tumbling) windows: panes when the size is a multiple of the slide, else
    one row per window."""
    cls = PanedWindowOperator if assigner.size % assigner.slide == 0 else ColumnarWindowOperator
    return cls(name, assigner, agg, key_selector, allowed_lateness, late_tag)

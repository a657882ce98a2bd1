"""``PanedWindowOperator``: sliding windows whose size is a multiple of the
slide (tumbling included) as a table of panes; a firing window is a range
reduction over its run of pane rows."""

from __future__ import annotations

import torch

from opforge.stream.columnar_windows import ColumnarWindows
from opforge.stream import grouping  # pair_codes through the module (tests replace it)
from opforge.stream.grouping import nonzero_known
from opforge.stream.range_reductions import range_extremes, range_sums
from opforge.stream.records import NO_TIMESTAMP, Batch
from opforge.stream.triggers import fire_mask


class PanedWindowOperator(ColumnarWindows):
    """Sliding windows whose size is ``k`` times the slide (tumbling: ``k =
    1``): one table row per (key, pane), a pane being the slide-long slice
    ``[p, p + slide)`` that holds a record (``p = ts - (ts - offset) mod
    slide``), so each record is folded once instead of ``k`` times. Window
    ``[s, s + size)`` is panes ``s, s + slide, .., s + size - slide``.

    A watermark moving from ``before`` to ``wm`` fires the windows whose last
    timestamp lies in ``(before, wm]`` (of a key, every start whose window
    holds one of its panes). One sort puts the pane rows in (key, pane)
    order, so a window's panes are a run of consecutive rows. Each firing
    window is found once, with no grouping, from the gaps between a key's
    neighbouring panes: at its first pane (``_window_ends``: the previous
    pane is out of the window) and at its last; the two give its span of
    rows. Its aggregations are range reductions over the span
    (``range_sums``: counts and integer sums are differences of prefix sums,
    float sums add the span's panes; ``range_extremes``: min / max from a
    sparse table; a mean is its sum over its count). The windows are
    ordered as the per-window table fires them, with one more sort: by
    window end, then by first appearance, a window's being the least row
    order (``t_seq``) among its panes (every record of a window that has
    not fired was on time for it, so the window's row would have been made
    with the first of them). A pane is dropped once its last window (start
    ``p``) is past the allowed lateness, when that window's row would be.

    A late record (some of its windows fired, within the lateness) goes into
    its pane alone and then fires, one by one, exactly those windows, each
    the merge of its panes as they are now — the rows, values and order of
    the per-window table's late firings. Records with no late window are
    folded per batch as one group-and-reduce, before the late ones: they
    belong to no window a late record fires."""

    layout = "panes"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.panes_per_window = self.assigner.size // self.assigner.slide

    def _process_run(self, batch, wm):
        """Records that see the watermark ``wm`` (an int, or one per record
        when no window end passes among them: ``ColumnarWindows.process_batch``)."""
        n = len(batch)
        if n == 0:
            return
        self._batch_no += 1
        a, lateness, k = self.assigner, self.lateness, self.panes_per_window
        ts, keys = batch.timestamps, batch.keys
        panes = ts - torch.remainder(ts - a.offset, a.slide)
        # a record's windows end (last timestamp) at first_end + j * slide, j < k
        first_end = panes + (a.slide - 1)
        placed = first_end + ((k - 1) * a.slide + lateness) > wm  # its last window is within the lateness
        row_late = ~placed & (ts + lateness <= wm)  # none of its windows takes it: side output
        # late: its first window within the lateness (end > wm - L) has fired (end <= wm)
        # (no int64 overflow at the minimal watermark)
        floor = wm.clamp(min=-(2**62) + lateness) - lateness if isinstance(wm, torch.Tensor) \
            else max(wm - lateness, -(2**62))
        j = (torch.div(floor - first_end, a.slide, rounding_mode="floor") + 1).clamp_(0, k)
        late = placed & (j < k) & fire_mask(self.trigger.on_element_batch(first_end + j * a.slide, wm))
        stats = self._stats([(ts == NO_TIMESTAMP).sum(), row_late.sum(), placed.sum(), late.sum(),
                             keys.min(), keys.max(), panes.min(), panes.max()], batch)
        if stats[0]:
            raise ValueError(f"{self.name}: a record has no timestamp; event-time windows need a "
                             "WatermarkStrategy with a timestamp assigner on the source")
        n_side, n_placed, n_late = stats[1], stats[2], stats[3]
        bounds = tuple(stats[4:8])
        if n_side:
            self.late.handle(batch.select(row_late))
        if n_placed:
            # every placed record's pane gets its row now (new rows in
            # lexicographic order, as the per-window table makes its rows);
            # only the records with no late window are folded in here
            if n_placed == n:
                cols, dtypes = self._values(batch)
                k_p, p_p, late_p = keys, panes, late
            else:
                idx = nonzero_known(placed, n_placed)
                cols, dtypes = self._values(batch, idx)
                k_p, p_p, late_p = keys.index_select(0, idx), panes.index_select(0, idx), late.index_select(0, idx)
            self._fold_batch(k_p, p_p, cols, dtypes, bounds, None if n_late == 0 else ~late_p)
            if n_late:
                wm_p = wm if not isinstance(wm, torch.Tensor) or n_placed == n else wm.index_select(0, idx)
                self._late_firings(nonzero_known(late_p, n_late), k_p, p_p, cols, dtypes, bounds, wm_p)
        self._enforce_budget()

    def _late_firings(self, idx, keys, panes, cols, dtypes, bounds, wm):
        """Each late record, in order: into its pane, then its fired windows
        still within the lateness (at the watermark it saw: ``wm``, one or
        per record) fire again, latest start first (the order of the
        per-window path)."""
        a, k = self.assigner, self.panes_per_window
        dev = self.device
        fired = []
        wm_of = wm.index_select(0, idx) if isinstance(wm, torch.Tensor) else torch.full_like(idx, wm)
        host = torch.stack([keys.index_select(0, idx), panes.index_select(0, idx), wm_of], 1).tolist()
        for i, (key, pane, wm) in zip(idx.tolist(), host):
            one = slice(i, i + 1)
            self._fold(self._slots(keys[one], panes[one], dtypes, bounds),
                       torch.ones(1, dtype=torch.int64, device=dev), {n: c[one] for n, c in cols.items()})
            # every pane sharing a window with this one, back from the cold tiers
            near = pane + torch.arange(1 - k, k, dtype=torch.int64) * a.slide
            self._cold_pairs(torch.full_like(near, key), near)
            # its windows ending in (wm - L, wm] (all of them hold `pane`), over the key's panes
            runs = self._pane_runs(torch.nonzero(self.t_key == key).flatten())
            lo_end, hi_end = max(wm - self.lateness, pane + a.slide - 2), pane + a.size - 1
            starts, first, last = self._window_ends(
                runs, lambda ends: (ends > lo_end) & (ends <= hi_end) &
                fire_mask(self.trigger.on_element_batch(ends, wm)))
            spans = self._window_spans(first, last, int(first.sum()))
            latest_first = torch.arange(spans[0].shape[0] - 1, -1, -1, device=dev)  # one key: starts ascend
            fired.append(self._merged(runs, starts, spans, latest_first))
        self.out.emit(Batch.concat(fired))

    # -- firing: a window is a run of its key's panes ---------------------------
    def _pane_runs(self, rows=None) -> torch.Tensor:
        """Table rows (all, or ``rows``) in (key, pane) order, where a
        window's panes are consecutive: one sort of their order-preserving
        codes (two stable sorts when the table's bounds are unknown or too
        wide for the codes). Tumbling windows need no order: each row is a
        window of its own."""
        if self.panes_per_window == 1:
            return torch.arange(self.t_key.shape[0], device=self.device) if rows is None else rows
        keys, panes = self.t_key, self.t_start
        if rows is not None:
            keys, panes = keys.index_select(0, rows), panes.index_select(0, rows)
        codes = None if self._bounds is None else grouping.pair_codes(keys, panes, self._bounds, self.assigner.slide)[0]
        if codes is not None:
            order = torch.argsort(codes)
        else:
            order = torch.argsort(panes, stable=True)
            order = order[torch.argsort(keys.index_select(0, order), stable=True)]
        return order if rows is None else rows.index_select(0, order)

    def _window_ends(self, runs, due_of):
        """For the pane rows ``runs`` (in (key, pane) order): the starts of
        the ``k`` windows holding each row (``[R, k]``; column ``c`` starts
        ``k - 1 - c`` slides before the pane, so that row-major order is
        (key, window start) order) and, among the windows ``due_of(ends)``
        picks (by last timestamp: the trigger's decision), those where the row is the window's
        first pane (``first``: the gap back to the key's previous pane is
        more than ``k - 1 - c`` slides) and those where it is the last
        (``last``: the gap to the next one is more than ``c``). Each window
        appears once in each mask, at the same rank: its panes are the rows
        from its ``first`` entry's to its ``last`` entry's."""
        a, k, dev = self.assigner, self.panes_per_window, self.device
        panes = self.t_start.index_select(0, runs)
        col = torch.arange(k, dtype=torch.int64, device=dev)
        starts = panes[:, None] - (k - 1 - col) * a.slide
        ends = starts + (a.size - 1)
        due = due_of(ends)
        if k == 1:  # tumbling: each row is a window of its own
            return starts, due, due
        keys = self.t_key.index_select(0, runs)
        # gap[i]: slides from row i - 1 to row i when both are the key's, else k (out of a window's reach)
        gap = torch.full((runs.shape[0] + 1,), k, dtype=torch.int64, device=dev)
        steps = torch.div(panes[1:] - panes[:-1], a.slide, rounding_mode="floor").clamp_(max=k)
        gap[1:-1] = torch.where(keys[1:] == keys[:-1], steps, k)
        return starts, due & (k - 1 - col < gap[:-1, None]), due & (col < gap[1:, None])

    def _window_spans(self, first, last, n: int):
        """The ``n`` windows of ``_window_ends``' masks as spans of the runs,
        in (key, start) order: ``(at, lo, width)``, ``at`` a window's place
        in the masks, its panes the rows ``lo .. lo + width - 1``."""
        k = self.panes_per_window
        at = nonzero_known(first.flatten(), n)
        lo = torch.div(at, k, rounding_mode="floor")
        return at, lo, torch.div(nonzero_known(last.flatten(), n), k, rounding_mode="floor") + 1 - lo

    def _merged(self, runs, starts, spans, order) -> Batch:
        """The windows ``spans`` (rows ``order`` of them) as result records:
        each aggregation a reduction over the window's span of pane rows
        (``range_sums``: counts, sums, a mean's sum; ``range_extremes``: min /
        max) — no grouping, no per-pane expansion."""
        k = self.panes_per_window
        at, lo, width = (t.index_select(0, order) for t in spans)
        accs = {}
        for name, (op, _) in self.agg.outputs.items():
            if op != "count":
                vals = self.t_acc[name].index_select(0, runs)
                accs[name] = range_sums(vals, lo, width, k) if op in ("sum", "mean") else \
                    range_extremes(vals, lo, width, k, op)
                if op == "sum" and k > 1 and self._checking(name) and not vals.dtype.is_floating_point:
                    est = range_sums(vals.to(torch.float64), lo, width, k)
                    bad = torch.nonzero((est - accs[name].to(torch.float64)).abs() > 2.0**63).flatten()
                    if bad.numel():
                        w = int(at[bad[0]])
                        raise self._overflow(name, int(self.t_key[runs[lo[bad[0]]]]),
                                             int(starts.flatten()[w]), "window")
        return self._window_batch(self.t_key.index_select(0, runs.index_select(0, lo)),
                                  starts.flatten().index_select(0, at),
                                  range_sums(self.t_count.index_select(0, runs), lo, width, k), accs)

    def _firing_order(self, runs, starts, spans) -> torch.Tensor:
        """The order in which the per-window table fires these windows: by
        start, then by first appearance, a window's being its panes' least
        row order (``t_seq``). The pairs are distinct: one sort of their
        order-preserving codes, or two stable sorts when they do not fit."""
        a = self.assigner
        at, lo, width = spans
        starts = starts.flatten().index_select(0, at)
        first = range_extremes(self.t_seq.index_select(0, runs), lo, width, self.panes_per_window, "min")
        codes = None
        if self._bounds is not None:  # the starts lie within the table's pane range and k - 1 slides before it
            s_lo = self._bounds[2] - (self.panes_per_window - 1) * a.slide
            codes, _ = grouping.pair_codes(starts, first, (s_lo, self._bounds[3], 0, self._next_seq - 1), 1)
        if codes is not None:
            return torch.argsort(codes)
        order = torch.argsort(first)
        return order[torch.argsort(starts.index_select(0, order), stable=True)]

    def _advance(self, watermark):
        before, self.watermark = self.watermark, watermark
        a = self.assigner
        # panes of the windows ending in (before, watermark]: their first
        # window ends at p + slide - 1, their last at p + size - 1
        after, upto = self.trigger.fire_range(before, watermark)
        self._take_cold(lambda p: (p + (a.slide - 1) <= upto) & (p + (a.size - 1) > after),
                        lambda lo, hi: lo + a.slide - 1 <= upto and hi + a.size - 1 > after)
        gone, n_gone = None, 0
        if self.t_key.shape[0]:
            runs = self._pane_runs()
            starts, first, last = self._window_ends(
                runs, lambda ends: fire_mask(self.trigger.on_event_time_batch(ends, before, watermark)))
            gone = self.t_start + (a.size - 1 + self.lateness) <= watermark  # its last window is past the lateness
            n_fire, n_gone = torch.stack([first.sum(), gone.sum()]).tolist()  # the one host sync
            if n_fire:
                spans = self._window_spans(first, last, n_fire)
                self.out.emit(self._merged(runs, starts, spans, self._firing_order(runs, starts, spans)))
        self._forget(gone, n_gone, watermark)

"""Integer sums of the columnar window operators never wrap around.

Each batch's read-back also brings the max and min of every integer sum's
column; their running bound (``n * max |value|`` summed over batches, the
*mass*) caps any row's or window's ``|sum|``. While it stays below 2**63
nothing more is done. Past it, every fold is checked exactly: a batch's
partial sums against their float64 estimates (a wrapped int64 sum is 2**64
away from its estimate, an exact one is not), the add into the table by the
sign rule, and a window merged from panes against its float64 estimate; the
first overflowing row raises ``StreamOverflowError`` naming the operator,
the aggregation, the key and the window (or pane).
"""

from __future__ import annotations

import torch

from opforge.stream.errors import StreamOverflowError, sum_overflow


class ExactSums:
    """Mixed into ``ColumnarWindows``: the mass per integer sum and the checks."""

    def _sum_range_parts(self, batch) -> tuple[list, list]:
        """The integer sums and, for the batch's read-back, the max and min
        of each one's column (0-d tensors)."""
        names, parts = [], []
        for name, (op, col) in self.agg.outputs.items():
            c = batch.columns.get(col) if op == "sum" else None
            if isinstance(c, torch.Tensor) and not c.dtype.is_floating_point and len(batch):
                names.append(name)
                parts += [c.max().to(torch.int64), c.min().to(torch.int64)]
        return names, parts

    def _note_ranges(self, names: list, stats: list, n: int) -> None:
        """Add ``n`` records' bound (``n * max |value|``) to each integer
        sum's mass: while a mass stays below 2**63 no row or window sum can
        leave int64 and nothing is checked; past it every fold and merge is
        checked exactly (``_checking``)."""
        for i, name in enumerate(names):
            top = max(abs(stats[2 * i]), abs(stats[2 * i + 1]))
            self._mass[name] = self._mass.get(name, 0) + n * top

    def _checking(self, name: str) -> bool:
        return self._mass.get(name, 0) >= 2**63 - 1

    def _stats(self, parts: list, batch) -> list:
        """``_batch_stats`` with the integer sums' value ranges in the same read-back."""
        names, extra = self._sum_range_parts(batch)
        stats = self._batch_stats(parts + extra)
        if extra:
            self._note_ranges(names, stats[len(parts):], len(batch))
        return stats[:len(parts)]

    def _overflow(self, name: str, key_id: int, start: int, what: str) -> StreamOverflowError:
        end = start + (self.assigner.slide if what == "pane" else self.assigner.size)
        return sum_overflow(self.name, name, self.agg.outputs[name][1], self.key_selector.decode(key_id),
                            f"{what} [{start}, {end})")

    def _check_fold(self, slots, bad: dict) -> None:
        """Raise for the first row (``slots``) whose sum overflowed (``bad``:
        name -> per-slot mask); one read-back for all of them."""
        if not bad:
            return
        names = list(bad)
        hit = torch.stack([m.any() for m in bad.values()]).tolist()
        for name, h in zip(names, hit):
            if h:
                row = int(slots[torch.nonzero(bad[name]).flatten()[0]])
                pane = self.layout == "panes" and self.assigner.size != self.assigner.slide
                raise self._overflow(name, int(self.t_key[row]), int(self.t_start[row]), "pane" if pane else "window")

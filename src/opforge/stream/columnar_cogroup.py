"""The columnar window co-group: ``a.co_group(b).where(k).equal_to(k)
.window(TumblingEventTimeWindows | SlidingEventTimeWindows).apply(fn)`` with a
``@vectorized`` ``fn``, run by ``WindowCoGroupOperator`` (the window join's
buffers and firing, ``columnar_join.WindowJoinOperator``, with groups in
place of pairs).

**The vectorized co-group function.** ``fn(first, second, groups)`` is
called once for a batch of fired (key, window) groups (Flink calls
``co_group(first, second)`` once per group):

* ``first`` / ``second``: ``Batch`` es of each input's rows of those groups,
  group by group (group ``g``'s rows are ``groups.first_offsets[g] ..
  first_offsets[g + 1] - 1``, in arrival order), timestamped with their
  group's window ``max_timestamp``. A group may have no rows on one side (it
  fires all the same, as in Flink); a side with no rows at all in the call
  may come as an empty ``Batch`` without columns.
* ``groups`` (``CoGroups``): ``count`` (G), ``first_offsets`` /
  ``second_offsets`` (int64, G + 1: segment offsets, for ``segment_reduce``
  and friends), ``first_group`` / ``second_group`` (int64, each row's group)
  and ``timestamps`` (int64, G: each group's window ``max_timestamp``).
  Groups come in the record path's firing order: by window end, then by the
  arrival of the group's first record.

It returns either one output row per group (a ``Batch``, a mapping of
columns or one tensor, G rows) or columns plus ``"__group__"`` (the group
each output row comes from) for any number of outputs per group. Outputs
carry their group's ``max_timestamp`` and come group by group in firing
order (a group's rows in the order returned), as the record form's.

The record form (``joins.WindowCoGroupFunction``, which the reference
executor runs) calls the same function with one group (G = 1) per firing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from opforge.stream.columnar_join import Rows, WindowJoinOperator, _firing_rank
from opforge.stream.functions import batch_result
from opforge.stream.grouping import group_pairs
from opforge.stream.records import Batch


@dataclass
class CoGroups:
    """The groups of one call of a vectorized co-group function (see the module doc)."""

    count: int
    first_offsets: torch.Tensor
    second_offsets: torch.Tensor
    first_group: torch.Tensor
    second_group: torch.Tensor
    timestamps: torch.Tensor


def _offsets(group: torch.Tensor, count: int) -> torch.Tensor:
    sizes = torch.bincount(group, minlength=count)
    return torch.cat([sizes.new_zeros(1), torch.cumsum(sizes, 0)])


def co_group_batches(fn, first: Batch, second: Batch, first_group: torch.Tensor, second_group: torch.Tensor,
                     times: torch.Tensor, where: str) -> Batch:
    """Call ``fn`` on both inputs' rows of ``len(times)`` groups (rows already
    group by group); its outputs, timed by group, group by group."""
    count = times.shape[0]
    groups = CoGroups(count, _offsets(first_group, count), _offsets(second_group, count), first_group,
                      second_group, times)
    res = fn(first, second, groups)
    like = Batch({}, times, None)
    if isinstance(res, dict) and "__group__" in res:
        res = dict(res)
        group = torch.as_tensor(res.pop("__group__"), dtype=torch.int64, device=times.device)
        order = torch.argsort(group, stable=True)
        res["__timestamp__"] = times.index_select(0, group)
        out = batch_result(res, like, where, same_length=False)
        return out.select(order).with_keys(None)
    return batch_result(res, like, where, same_length=True).with_keys(None)


def co_group_records(fn, first: list, second: list, ts: int, where: str) -> list:
    """The record path: ``fn`` on one group's records (host batches); the outputs as records."""
    def side(records):
        return Batch.from_records(records, "cpu", [ts] * len(records), where=where)

    zero = torch.zeros(0, dtype=torch.int64)
    out = co_group_batches(fn, side(first), side(second), zero.new_zeros(len(first)), zero.new_zeros(len(second)),
                           torch.tensor([ts], dtype=torch.int64), where)
    return out.records()


class WindowCoGroupOperator(WindowJoinOperator):
    """A window co-group of event-time tumbling or sliding windows, whole batches at a time."""

    def __init__(self, name, assigner, function, key_selector):
        super().__init__(name, assigner, function, key_selector, method="co_group")

    def _join_windows(self, first: Rows, second: Rows, prev: int, wm: int) -> None:
        r0, s0 = self._due(first, prev, wm)
        r1, s1 = self._due(second, prev, wm)
        n0 = r0.shape[0]
        if n0 + r1.shape[0] == 0:
            return
        keys = torch.cat([first.key.index_select(0, r0), second.key.index_select(0, r1)])
        panes, inv = group_pairs(keys, torch.cat([s0, s1]))
        count, starts = panes.shape[0], panes[:, 1]
        seqs = torch.cat([first.seq.index_select(0, r0), second.seq.index_select(0, r1)])
        opened = torch.full((count,), 2**63 - 1, dtype=torch.int64, device=inv.device) \
            .scatter_reduce(0, inv, seqs, "amin")
        rank = _firing_rank(starts, opened)  # a group's place in the firing order
        times = torch.empty_like(starts)
        times[rank] = starts + (self.assigner.size - 1)
        sides = []
        for rows, r, g in ((first, r0, inv[:n0]), (second, r1, inv[n0:])):
            g = rank.index_select(0, g)
            order = torch.argsort(rows.seq.index_select(0, r))  # arrival, then group
            order = order.index_select(0, torch.argsort(g.index_select(0, order), stable=True))
            g = g.index_select(0, order)
            picked = rows.take(r.index_select(0, order))
            sides.append((picked.batch(times.index_select(0, g), self.schemas[len(sides)]), g))
        (a, ga), (b, gb) = sides
        out = co_group_batches(self.fn, a, b, ga, gb, times, self.name)
        if len(out):
            self.out.emit(out)

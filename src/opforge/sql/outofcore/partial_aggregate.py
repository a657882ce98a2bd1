"""Aggregation in two steps over a stream: each chunk is aggregated on its own (partial), then the
partials are aggregated into the answer (final). Why: a chunk of a billion-row scan reduces to its
groups right away, so what waits (and may spill) is the partials, not the rows (TPC-H q1: four
groups per chunk instead of the chunk).

Decomposable aggregates only: count / count(*) (final: sum of the counts), sum, min, max (final:
the same over the partials) and avg (partial: a float sum and a count; final: their sums divided).
A NULL partial (a group whose values were all NULL in a chunk) is ignored by the final step as SQL
ignores NULL inputs. count(DISTINCT) is not decomposable: such an aggregation partitions its rows
instead (``grace.grace_aggregate``)."""
from __future__ import annotations

from dataclasses import dataclass

from opforge.sql import types as T
from opforge.sql.column import Column
from opforge.sql.expr import Batch, Ref
from opforge.sql.plan import AggCall, Aggregate, OutCol

DECOMPOSABLE = ("count", "count_star", "sum", "min", "max", "avg")


@dataclass
class TwoStep:
    partial: Aggregate  # over the rows: keys as the original, partial aggregates
    final: Aggregate  # over the partials: keys as Refs, the original output cids (avg: sum and count)
    averages: list[tuple[OutCol, int, int]]  # (avg output, final sum cid, final count cid)

    def finish(self, out: Batch) -> Batch:
        """The final step's output with each avg made from its sum and count."""
        cols = dict(out.cols)
        for o, s, c in self.averages:
            total, count = cols.pop(s), cols.pop(c)
            has = count.values > 0
            cols[o.cid] = Column(total.values / count.values.clamp(min=1).to(total.values.dtype),
                                 None if bool(has.all()) else has, T.FLOAT64)
        return Batch(cols, out.n, out.device)


def decomposable(node: Aggregate) -> bool:
    return all(call.func in DECOMPOSABLE for _, call in node.aggs)


def two_step(node: Aggregate) -> TwoStep:
    fresh = iter(range(-1, -(1 << 30), -1))  # cids of the partial columns: negative, never the plan's

    def col(name: str, typ: T.SqlType) -> OutCol:
        return OutCol(next(fresh), name, typ)

    partial_aggs, final_aggs, averages = [], [], []
    for o, call in node.aggs:
        if call.func in ("count", "count_star"):
            p = col(o.name, T.INT64)
            partial_aggs.append((p, AggCall(call.func, call.arg, T.INT64)))
            final_aggs.append((o, AggCall("sum", Ref(p.cid, T.INT64), T.INT64)))
        elif call.func == "avg":
            s, c = col(o.name + "_sum", T.FLOAT64), col(o.name + "_count", T.INT64)
            partial_aggs += [(s, AggCall("sum", call.arg, T.FLOAT64)), (c, AggCall("count", call.arg, T.INT64))]
            fs, fc = col(o.name + "_sum", T.FLOAT64), col(o.name + "_count", T.INT64)
            final_aggs += [(fs, AggCall("sum", Ref(s.cid, T.FLOAT64), T.FLOAT64)),
                           (fc, AggCall("sum", Ref(c.cid, T.INT64), T.INT64))]
            averages.append((o, fs.cid, fc.cid))
        else:  # sum, min, max: the same over the partials, in the output type
            p = col(o.name, o.type)
            partial_aggs.append((p, AggCall(call.func, call.arg, o.type)))
            final_aggs.append((o, AggCall(call.func, Ref(p.cid, o.type), o.type)))
    partial = Aggregate(node.child, list(node.keys), partial_aggs, node.grouped)
    final_keys = [(o, Ref(o.cid, o.type, o.name)) for o, _ in node.keys]
    final = Aggregate(partial, final_keys, final_aggs, node.grouped)
    return TwoStep(partial, final, averages)

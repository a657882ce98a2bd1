"""``KeyedStream.reduce`` and ``sum/min/max(field)``: rolling aggregates, one
updated result per record (Flink's semantics: ``sum/min/max`` keep the key's
first record and replace ``field`` by the running aggregate).

``sum/min/max`` on a number column run as tensor code over the micro-batch:
rows sorted by key (stable), an inclusive segmented scan (log-step, any
device) seeded with each key's running value, results scattered back to
arrival order. Per-key state is a table on the device (running value, first
record's columns); one host sync per batch maps the batch's distinct keys to
table rows. Float sums may differ from a sequential sum in the last bits.
``reduce(fn)`` and non-number fields call Python once per record.

Under a state budget (``env.set_state_budget``) the table's rows touched
longest ago move to host memory and to Arrow files (``state_budget.ColdRows``)
when its tensors outgrow ``device_bytes``, and come back when a batch meets
their key; checkpoints hold every tier.
"""

from __future__ import annotations

import torch

from opforge.stream.errors import StreamOverflowError, at_record
from opforge.stream.functions import as_callable, field_of
from opforge.stream.operators import Operator, records_batch
from opforge.stream.records import Batch, RecordSchema, concat_columns, take
from opforge.stream.state_budget import ColdRows

_COMBINE = {"sum": torch.add, "min": torch.minimum, "max": torch.maximum}


def segmented_scan(values: torch.Tensor, segments: torch.Tensor, op: str) -> torch.Tensor:
    """Inclusive scan of ``values`` restarting where ``segments`` (sorted ids) changes."""
    combine = _COMBINE[op]
    out, d, n = values, 1, values.shape[0]
    while d < n:
        same = segments[d:] == segments[:-d]
        out = torch.cat([out[:d], torch.where(same, combine(out[d:], out[:-d]), out[d:])])
        d *= 2
    return out


class RollingOperator(Operator):
    def __init__(self, name, key_selector, reduce_fn=None, op=None, field=None):
        super().__init__(name)
        self.key_selector = key_selector
        self.reduce = as_callable(reduce_fn, "reduce", name) if reduce_fn is not None else None
        self.op, self.field = op, field

    def open(self):
        self.acc: dict = {}  # record path: key -> current result
        self.slot_of: dict[int, int] = {}  # columnar path: key id -> table row
        self.first: dict = {}  # column -> first records' values (tensor or list)
        self.running: torch.Tensor | None = None
        self.touch: torch.Tensor | None = None  # per row: the last batch that met its key
        self.schema: RecordSchema | None = None
        self._batch_no = 0
        self._mass = 0  # integer sums: a bound on any running |sum| (exact checks past 2**63)
        budget = getattr(self, "state_budget", None)
        self.cold = ColdRows(budget, f"{self.name}-{self.index}") if budget is not None else None

    def _column_name(self, batch: Batch) -> str:
        name = self.field if isinstance(self.field, str) else f"f{self.field}"
        if name not in batch.columns:
            raise ValueError(f"{self.name}: the records have no field {self.field!r} "
                             f"(fields: {list(batch.columns)})")
        return name

    def process_batch(self, batch):
        if len(batch) == 0:
            return
        if self.reduce is None:
            col = batch.columns[self._column_name(batch)]
            if isinstance(col, torch.Tensor) and col.dtype != torch.bool and not self.acc:
                self._columnar(batch, self._column_name(batch))
                return
        self._records(batch)

    # -- Python per record ----------------------------------------------------
    def _combine(self, prev, rec, schema: RecordSchema):
        if self.reduce is not None:
            return self.reduce(prev, rec)
        a, b = field_of(prev, self.field, self.name), field_of(rec, self.field, self.name)
        v = a + b if self.op == "sum" else (min(a, b) if self.op == "min" else max(a, b))
        values = list(schema.fields_of(prev, self.name))
        values[schema.names.index(self._column_name_of(schema))] = v
        return schema.make(tuple(values))

    def _column_name_of(self, schema):
        return self.field if isinstance(self.field, str) else f"f{self.field}"

    def _records(self, batch):
        if self.slot_of:
            raise TypeError(f"{self.name}: field {self.field!r} changed from numbers to other values")
        out, r = [], None
        try:
            for k, r in zip(batch.keys.tolist(), batch.records()):
                prev = self.acc.get(k)
                cur = r if prev is None else self._combine(prev, r, batch.schema)
                self.acc[k] = cur
                out.append(cur)
        except Exception as e:
            raise at_record(e, r)
        self.out.emit(records_batch(out, batch.timestamps, self.device, self.name))

    # -- tensors --------------------------------------------------------------
    def _columnar(self, batch: Batch, name: str) -> None:
        keys = batch.keys
        order = torch.argsort(keys, stable=True)
        sk = keys[order]
        new = torch.ones_like(sk, dtype=torch.bool)
        new[1:] = sk[1:] != sk[:-1]
        seg = torch.cumsum(new, 0) - 1
        starts = torch.nonzero(new).flatten()
        col = batch.columns[name]
        vals = col[order]
        if self.running is not None and self.running.dtype != vals.dtype:
            vals = vals.to(torch.promote_types(self.running.dtype, vals.dtype))
            self.running = self.running.to(vals.dtype)
        # table rows of this batch's keys; new keys keep their first record
        int_sum = self.op == "sum" and not vals.dtype.is_floating_point
        if int_sum:  # the value range comes with the keys, in the same read-back
            host = torch.cat([sk[starts], vals.max().to(torch.int64)[None], vals.min().to(torch.int64)[None]]).tolist()
            seg_keys = host[:-2]
            self._mass += len(vals) * max(abs(host[-2]), abs(host[-1]))
        else:
            seg_keys = sk[starts].tolist()  # the host sync: one per distinct key
        self._bring_back([k for k in seg_keys if k not in self.slot_of])
        fresh = [i for i, k in enumerate(seg_keys) if k not in self.slot_of]
        if fresh:
            self._add_keys(batch, order[starts[fresh]], [seg_keys[i] for i in fresh], vals[starts[fresh]])
        slots = torch.tensor([self.slot_of[k] for k in seg_keys], dtype=torch.int64, device=self.device)
        # seed each segment with its key's running value (a fresh key's own first value)
        seeded = vals.clone()
        seed = self.running[slots]
        known = torch.ones(len(seg_keys), dtype=torch.bool, device=self.device)
        if fresh:
            known[torch.tensor(fresh, device=self.device)] = False
        seeded[starts] = torch.where(known, _COMBINE[self.op](seed, vals[starts]), vals[starts])
        scanned = segmented_scan(seeded, seg, self.op)
        if int_sum and self._mass >= 2**63 - 1:
            self._check_sums(scanned, vals, starts, known, seed, seg, sk, name)
        ends = torch.cat([starts[1:] - 1, torch.tensor([sk.shape[0] - 1], device=self.device)])
        self.running[slots] = scanned[ends]
        result = torch.empty_like(scanned)
        result[order] = scanned
        row_slots = torch.empty_like(order)
        row_slots[order] = slots[seg]
        cols = {n: (result if n == name else take(c, row_slots)) for n, c in self.first.items()}
        self._batch_no += 1
        self.touch[slots] = self._batch_no
        self.out.emit(Batch(cols, batch.timestamps, self.schema))
        self._enforce_budget()

    def _check_sums(self, scanned, vals, starts, known, seed, seg, sk, name) -> None:
        """Running integer sums never wrap: each against its float64 estimate
        (a wrapped one is 2**64 away); the first wrong one raises."""
        est = vals.to(torch.float64)
        first = est[starts]
        est[starts] = torch.where(known, seed.to(torch.float64) + first, first)
        est = segmented_scan(est, seg, "sum")
        bad = torch.nonzero((est - scanned.to(torch.float64)).abs() > 2.0**63).flatten()
        if bad.numel():
            key = self.key_selector.decode(int(sk[int(bad[0])]))
            raise StreamOverflowError(f"{self.name}: the rolling sum of field {name!r} of key {key!r} exceeds the "
                                      "int64 range [-2**63, 2**63 - 1]; sum a float column (or smaller values) "
                                      "instead", f"sum({name})", name)

    def _add_keys(self, batch, rows, keys, first_values):
        base = len(self.slot_of)
        for i, k in enumerate(keys):
            self.slot_of[k] = base + i
        firsts = batch.select(rows)
        touch = torch.zeros(len(keys), dtype=torch.int64, device=self.device)
        if self.schema is None:
            self.schema = batch.schema
            self.first = dict(firsts.columns)
            self.running = first_values.clone()
            self.touch = touch
            return
        self.first = {n: concat_columns([c, firsts.columns[n]]) for n, c in self.first.items()}
        self.running = torch.cat([self.running, first_values.to(self.running.dtype)])
        self.touch = torch.cat([self.touch, touch])

    # -- the state budget: table rows <-> host / disk (state_budget.py) -------
    def _rows(self, keep: torch.Tensor | None = None) -> dict:
        """The table as rows (ColdRows' layout: ``key`` and a zero ``start`` for its zone maps)."""
        keys = torch.tensor(list(self.slot_of), dtype=torch.int64, device=self.device)  # slot order
        rows = {"key": keys, "start": torch.zeros_like(keys), "running": self.running, "touch": self.touch,
                **{f"first.{n}": c for n, c in self.first.items()}}
        return rows if keep is None else {n: take(c, keep) for n, c in rows.items()}

    def _set_rows(self, rows: dict) -> None:
        self.slot_of = {k: i for i, k in enumerate(rows["key"].tolist())}
        self.running, self.touch = rows["running"], rows["touch"]
        self.first = {n[6:]: c for n, c in rows.items() if n.startswith("first.")}

    def table_bytes(self) -> int:
        if self.running is None:
            return 0
        cols = [self.running, self.touch] + [c for c in self.first.values() if isinstance(c, torch.Tensor)]
        return sum(c.element_size() * c.numel() for c in cols) + 8 * len(self.slot_of)

    def _enforce_budget(self) -> None:
        """Move the rows touched longest ago to the host tier until the table fits."""
        if self.cold is None or not self.slot_of:
            return
        n, size, limit = len(self.slot_of), self.table_bytes(), self.cold.budget.device_bytes
        if size <= limit:
            return
        keep = min(n, limit * n // size)
        order = torch.argsort(self.touch, stable=True)
        evicted = self._rows(order[:n - keep])
        self.cold.add({k: (c.cpu() if isinstance(c, torch.Tensor) else c) for k, c in evicted.items()})
        self._set_rows(self._rows(torch.sort(order[n - keep:]).values))

    def _bring_back(self, keys: list) -> None:
        """The cold rows of these keys, back at the end of the table."""
        if self.cold is None or not keys or len(self.cold) == 0:
            return
        want = torch.tensor(keys, dtype=torch.int64)
        lo, hi = int(want.min()), int(want.max())
        rows = self.cold.take(lambda r: torch.isin(r["key"], want), lambda f: f["kmin"] <= hi and f["kmax"] >= lo)
        if rows is not None:
            self._append(rows)

    def _append(self, rows: dict) -> None:
        dev = self.device
        rows = {n: (c.to(dev) if isinstance(c, torch.Tensor) else c) for n, c in rows.items()}
        if self.running is not None and self.slot_of:
            rows = {n: concat_columns([c, rows[n]]) for n, c in self._rows().items()}
        elif self.running is not None:
            rows["running"] = rows["running"].to(self.running.dtype)
        self._set_rows(rows)

    def full_state(self) -> tuple[dict, dict, torch.Tensor | None]:
        """(slot_of, first, running) over every tier, the device rows first (checkpoints)."""
        if self.cold is None or len(self.cold) == 0:
            return self.slot_of, self.first, self.running
        rows = self._rows() if self.slot_of else None
        cold = self.cold.take_all()
        cold = {n: (c.to(self.device) if isinstance(c, torch.Tensor) else c) for n, c in cold.items()}
        rows = cold if rows is None else {n: concat_columns([c, cold[n]]) for n, c in rows.items()}
        return ({k: i for i, k in enumerate(rows["key"].tolist())},
                {n[6:]: c for n, c in rows.items() if n.startswith("first.")}, rows["running"])

    def restored(self) -> None:
        """The table was replaced by a checkpoint's (every tier): all rows on the device again."""
        if self.running is not None:
            self.touch = torch.zeros(self.running.shape[0], dtype=torch.int64, device=self.device)
            if not self.running.dtype.is_floating_point:
                self._mass = int(self.running.to(torch.float64).abs().sum()) + 1
        if self.cold is not None:
            self.cold.clear()

    def dispose(self) -> None:
        """The job ended (however): spill files and the host tier go."""
        if self.cold is not None:
            self.cold.clear()

"""WITH RECURSIVE: a CTE that reads itself is computed when the query is bound, by iteration to a
fixpoint, and read back as a hidden table of the connection.

Why at bind time: the plan is a tree of whole-batch operators with no loop; the recursion runs the
anchor once, then the recursive term over the rows the last step added (the working table), until
a step adds none. UNION ALL keeps every row of every step; UNION drops the rows seen before (and
duplicates within a step), so a recursion over a cycle stops. Each step is a query of its own:
the working table is registered under a hidden name that the recursive term's reference to the
CTE reads. A recursion that has not stopped after :data:`MAX_ITERATIONS` steps is an error naming
the CTE, never a silently cut result."""
from __future__ import annotations

import itertools

import pyarrow as pa
from sqlglot import exp

from opforge.sql.errors import NotSupportedError, SqlError

MAX_ITERATIONS = 10_000
_NAMES = itertools.count()


def references(query: exp.Expression, name: str) -> bool:
    return any(t.name.lower() == name and t.args.get("db") is None for t in query.find_all(exp.Table))


def materialize(binder, name: str, query: exp.Expression, columns: list[str], outer_ctes: list) -> exp.Select:
    """Computes the recursive CTE ``name`` (body ``query``, column names ``columns``) and returns
    the query that reads its rows (``SELECT * FROM`` its hidden table). ``outer_ctes``: the CTE
    frames its body sees (those around it and the CTEs before it)."""
    catalog = binder.catalog
    if not hasattr(catalog, "run_table"):
        raise NotSupportedError(f"WITH RECURSIVE {name}: this catalog cannot run queries while binding")
    if not isinstance(query, exp.Union):
        raise SqlError(f"WITH RECURSIVE {name}: a recursive CTE must be anchor UNION [ALL] recursive term")
    anchor, step, distinct = query.this, query.expression, bool(query.args.get("distinct"))
    if references(anchor, name):
        raise NotSupportedError(f"WITH RECURSIVE {name}: a reference to the CTE in its anchor (left of the last UNION)")
    for clause in ("order", "limit", "offset"):
        if query.args.get(clause) is not None:
            raise NotSupportedError(f"WITH RECURSIVE {name}: {clause.upper()} on the recursive UNION")

    def run(q: exp.Expression, frames: list) -> pa.Table:
        node, _ = binder._with_ctes(frames, binder.bind_query, q, None)
        return catalog.run_table(node)

    first = run(anchor, outer_ctes)
    names = list(columns) + first.column_names[len(columns):]
    if len(columns) > first.num_columns:
        raise SqlError(f"{name}: {len(columns)} column names given for {first.num_columns} columns")
    schema = pa.schema([pa.field(n, f.type) for n, f in zip(names, first.schema)])
    seen: set = set()
    work = _new_rows(_conform(first, schema, name), seen) if distinct else _conform(first, schema, name)
    parts = [work]
    work_name = f"__recursive_work_{next(_NAMES)}"
    reader = exp.select("*").from_(exp.to_table(work_name))
    try:
        for _ in range(MAX_ITERATIONS):
            if work.num_rows == 0:
                break
            catalog.put_table(work_name, work)
            # a scalar subquery of the step that reads the working table has the same text and CTE context
            # every iteration but another value: the binder's once-per-statement values are forgotten
            binder.forget_scalar_values()
            out = _conform(run(step, outer_ctes + [{name: (reader, names)}]), schema, name)
            work = _new_rows(out, seen) if distinct else out
            parts.append(work)
        else:
            raise SqlError(f"WITH RECURSIVE {name}: no fixpoint after {MAX_ITERATIONS} iterations "
                           "(the recursive term keeps adding rows)")
    finally:
        catalog.drop_table(work_name)
    result_name = f"__recursive_{next(_NAMES)}"
    catalog.put_table(result_name, pa.concat_tables(parts))
    return exp.select("*").from_(exp.to_table(result_name))


def _conform(t: pa.Table, schema: pa.Schema, name: str) -> pa.Table:
    """The rows of one step with the anchor's column names and types."""
    if t.num_columns != len(schema):
        raise SqlError(f"WITH RECURSIVE {name}: the recursive term has {t.num_columns} columns, "
                       f"the anchor {len(schema)}")
    t = pa.Table.from_arrays(t.columns, names=schema.names)
    try:
        return t.cast(schema)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise SqlError(f"WITH RECURSIVE {name}: the recursive term's rows do not fit the anchor's "
                       f"types {[str(f.type) for f in schema]}: {e}") from None


from opforge.sql.nested import sort_key  # noqa: E402


def _new_rows(t: pa.Table, seen: set) -> pa.Table:
    """UNION's step: the rows of ``t`` not seen before, each once (NULLs equal, as in DISTINCT)."""
    keep = []
    for i, row in enumerate(zip(*(c.to_pylist() for c in t.columns))):
        row = tuple(sort_key(v) if isinstance(v, (list, dict)) else v for v in row)  # LIST / STRUCT: hashable
        if row not in seen:
            seen.add(row)
            keep.append(i)
    return t.take(pa.array(keep, pa.int64())) if len(keep) < t.num_rows else t

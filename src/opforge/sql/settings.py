"""SET / RESET of DuckDB settings. ``default_null_order`` changes results, so it is applied (to
every ORDER BY without an explicit NULLS FIRST / LAST); settings that only tune DuckDB's execution
(threads, caching, ...) are accepted and have no effect here; any other setting is refused rather
than ignored, since it could change an answer."""
from __future__ import annotations

import re

from sqlglot import exp

from opforge.sql.errors import NotSupportedError, SqlError
from opforge.sql.outofcore.sizes import parse_size

NULL_ORDERS = ("nulls_last", "nulls_first", "nulls_first_on_asc_last_on_desc", "nulls_last_on_asc_first_on_desc")
# DuckDB settings that tune execution only: no query result depends on them
NO_EFFECT = {"threads", "debug_force_external", "enable_caching_operators", "delim_join_as_cte",
             "preserve_insertion_order", "pivot_filter_threshold", "max_execution_time",
             "enable_progress_bar", "enable_object_cache", "verify_parallelism", "disabled_optimizers"}
_RESET = re.compile(r"^\s*reset\s+(session\s+|global\s+|local\s+)?(\w+)\s*;?\s*$", re.IGNORECASE)
_NULLS_WORD = re.compile(r"\bnulls\s+(first|last)\b", re.IGNORECASE)


class Settings:
    def __init__(self):
        self.default_null_order = "nulls_last"
        self.order_by_non_integer_literal = False  # ORDER BY 'literal' is an error unless set
        # a scalar subquery with several rows is an error; false: its first row (any row, correlated)
        self.scalar_subquery_error_on_multiple_rows = True
        self.memory_limit: int | None = None  # the device limit of the out-of-core path (sql/outofcore)

    def set(self, tree: exp.Set) -> str:
        for item in tree.expressions:
            eq = item.this
            if not isinstance(eq, exp.EQ):
                raise NotSupportedError(f"SET {item.sql(dialect='duckdb')}")
            name = eq.this.name.lower()
            value = eq.expression
            if name == "default_null_order":
                text = value.name.lower()
                if text not in NULL_ORDERS:
                    raise SqlError(f"SET default_null_order: expected one of {', '.join(NULL_ORDERS)}, got {text!r}")
                self.default_null_order = text
            elif name == "order_by_non_integer_literal":
                self.order_by_non_integer_literal = _bool_setting(name, value)
            elif name == "scalar_subquery_error_on_multiple_rows":
                self.scalar_subquery_error_on_multiple_rows = _bool_setting(name, value)
            elif name in ("memory_limit", "max_memory"):
                self.memory_limit = parse_size(value.name if isinstance(value, exp.Literal) else value.sql(), name)
            elif name not in NO_EFFECT:
                raise NotSupportedError(f"SET {name}")
        return "set"

    def reset(self, text: str) -> str | None:
        """RESET name (sqlglot leaves it unparsed): the message, or None when ``text`` is not a RESET."""
        m = _RESET.match(text)
        if m is None:
            return None
        name = m.group(2).lower()
        if name == "default_null_order":
            self.default_null_order = "nulls_last"
        elif name == "order_by_non_integer_literal":
            self.order_by_non_integer_literal = False
        elif name == "scalar_subquery_error_on_multiple_rows":
            self.scalar_subquery_error_on_multiple_rows = True
        elif name in ("memory_limit", "max_memory"):
            self.memory_limit = None
        elif name not in NO_EFFECT:
            raise NotSupportedError(f"RESET {name}")
        return "reset"

    def apply(self, tree: exp.Expression, text: str) -> exp.Expression:
        """The query with the default NULL order made explicit where the text leaves it open.
        sqlglot reads a plain ORDER BY and one with NULLS LAST alike, so a statement naming NULLS
        FIRST / LAST anywhere is left as written."""
        if self.default_null_order == "nulls_last":
            return tree
        if _NULLS_WORD.search(text):
            # every ORDER BY term names its NULL order, or some follow the setting and the tree
            # cannot tell which (refused: a wrong NULL placement would be a wrong answer)
            if len(_NULLS_WORD.findall(text)) < len(list(tree.find_all(exp.Ordered))):
                raise NotSupportedError(f"SET default_null_order={self.default_null_order} with ORDER BY terms "
                                        "both with and without NULLS FIRST / LAST in one statement")
            return tree
        for o in tree.find_all(exp.Ordered):
            desc = bool(o.args.get("desc"))
            first = {"nulls_first": True, "nulls_first_on_asc_last_on_desc": not desc,
                     "nulls_last_on_asc_first_on_desc": desc}[self.default_null_order]
            o.set("nulls_first", first)
        return tree


def _bool_setting(name: str, value: exp.Expression) -> bool:
    text = value.sql(dialect="duckdb").strip("'").lower()
    if text not in ("true", "false", "1", "0"):
        raise SqlError(f"SET {name}: expected true or false, got {value.sql()}")
    return text in ("true", "1")

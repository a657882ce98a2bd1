"""SQL scalar expressions, one concept per module:

- ``batch``: the Batch of columns that flows between operators;
- ``tree``: the bound expression tree (Ref, Lit, Func) and its constructors and walkers;
- ``result_types``: the result types of arithmetic;
- ``evaluation``: vectorized evaluation, dispatching to the evaluators registered by
  ``casts``, ``arithmetic``, ``compare``, ``logic``, ``string_functions``, ``string_calls``,
  ``date_functions``;
- ``rewrites``: substitution, constant folding, OR factoring.

Columns are referenced by a globally unique id (cid), so an expression can be evaluated on any batch that
holds those ids: the optimizer moves expressions between operators without renumbering.
The names below are the package's public interface (``from opforge.sql.expr import X``)."""
from opforge.sql.expr.batch import Batch
from opforge.sql.expr.tree import (
    Expr, Func, Lit, Ref, and_, cmp, conjuncts, disjuncts, equi_pair, is_const, split_equi,
)
from opforge.sql.expr.result_types import arith_type
from opforge.sql.expr.evaluation import evaluate
from opforge.sql.expr.casts import cast_values
from opforge.sql.expr import arithmetic, date_functions, logic, single_row, string_calls  # noqa: F401  (register their evaluators)
from opforge.sql.expr import graphemes, nested_functions, string_casts  # noqa: F401,E402  (their evaluators)
from opforge.sql.expr.compare import comparable
from opforge.sql.expr.string_functions import device_like, like_regex
from opforge.sql.expr.rewrites import factor_or, fold_constants, substitute, value_with

__all__ = [
    "Batch", "Expr", "Func", "Lit", "Ref", "and_", "arith_type", "cast_values", "cmp", "comparable", "conjuncts",
    "device_like", "disjuncts", "equi_pair", "evaluate", "factor_or", "fold_constants", "is_const", "like_regex",
    "split_equi", "substitute", "value_with",
]

"""``opforge bench``: bench families (one module each, found by
:mod:`opforge.bench.families`), the harness that runs them, and its helpers."""

"""The operator runtime: registry, dispatch, autotune, caches, timing, roofline."""

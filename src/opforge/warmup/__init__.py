"""Ahead-of-time compilation: ``opforge warmup``.

``launches`` records the kernel specializations a workload launches,
``workloads`` are the runs that make the shipped per-engine ``manifests``
(``manifest``), and ``compile`` compiles a manifest into Triton's on-disk
cache in parallel, so that a process's first query or op call finds its
kernels compiled. ``command`` is the CLI entry.
"""

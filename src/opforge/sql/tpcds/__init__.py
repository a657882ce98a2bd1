"""TPC-DS on opforge.sql against DuckDB: data and queries from DuckDB's tpcds extension
(``tpcds/data.py``), the runner (``tpcds/runner.py``), ``benchmarks/tpcds.py`` for timed runs."""

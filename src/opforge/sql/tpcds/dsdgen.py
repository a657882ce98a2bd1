"""Write TPC-DS data and queries with DuckDB's tpcds extension; run by ``tpcds/data.py`` in ``.venv-tpcds``.

    .venv-tpcds/bin/python dsdgen.py OUT_DIR SF

Standalone (the standard library and duckdb only): the extension is built for duckdb 1.5.5, while
the project's tests pin a newer DuckDB, so this script runs in its own venv (tests/sql/tpcds/
requirements.txt). It writes one Parquet file per table, ``queries.json`` (the 99 queries of
``tpcds_queries()``) and, last, ``manifest.json``, whose presence marks a finished data set.
"""

import json
import os
import sys


def extension_path() -> str:
    import duckdb
    import duckdb_extension_tpcds

    folder = os.path.join(os.path.dirname(duckdb_extension_tpcds.__file__), "extensions", f"v{duckdb.__version__}")
    return os.path.join(folder, "tpcds.duckdb_extension")


def main(out: str, sf: float) -> None:
    import duckdb

    con = duckdb.connect(config={"allow_unsigned_extensions": "true"})
    con.execute(f"LOAD '{extension_path()}'")
    con.execute(f"CALL dsdgen(sf={float(sf)!r})")
    tables = {}
    for (name,) in con.execute("SELECT table_name FROM information_schema.tables ORDER BY 1").fetchall():
        path = os.path.join(out, f"{name}.parquet")
        con.execute(f"COPY \"{name}\" TO '{path}' (FORMAT parquet)")
        tables[name] = {"file": f"{name}.parquet", "rows": con.execute(f'SELECT count(*) FROM "{name}"').fetchone()[0]}
    queries = {int(n): text for n, text in con.execute("SELECT query_nr, query FROM tpcds_queries()").fetchall()}
    with open(os.path.join(out, "queries.json"), "w") as f:
        json.dump(queries, f, indent=1)
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump({"sf": float(sf), "duckdb": duckdb.__version__, "tables": tables}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]))

"""TPC-DS at SF 0.01, generated once per test session (DuckDB's tpcds extension, run from
``.venv-tpcds``: ``make .venv-tpcds``) under the throw-away cache dir of tests/conftest.py."""

import os
from pathlib import Path

import pytest

SF = 0.01


@pytest.fixture(scope="session")
def tpcds_root() -> Path:
    return Path(os.environ["OPFORGE_CACHE_DIR"]) / "tpcds"


@pytest.fixture(scope="session")
def tpcds_paths(tpcds_root):
    from opforge.sql.tpcds import data

    return data.generate(SF, tpcds_root)


@pytest.fixture(scope="session")
def tpcds_queries(tpcds_paths, tpcds_root):
    from opforge.sql.tpcds import data

    return data.queries(SF, tpcds_root)

"""TPC-H at SF 0.01, generated once per test session under the throw-away cache dir
that tests/conftest.py sets ($OPFORGE_CACHE_DIR), with DuckDB's answers beside it."""

import os
from pathlib import Path

import pytest

SF = 0.01


@pytest.fixture(scope="session")
def tpch_root() -> Path:
    return Path(os.environ["OPFORGE_CACHE_DIR"]) / "tpch"


@pytest.fixture(scope="session")
def tpch_paths(tpch_root):
    from opforge.sql.tpch import data

    return data.generate(SF, tpch_root)


@pytest.fixture(scope="session")
def tpch_answers(tpch_paths, tpch_root):
    from opforge.sql.tpch import reference

    return reference.answers(SF, tpch_root)

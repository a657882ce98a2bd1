"""TPC-DS tables and the 99 queries from DuckDB's tpcds extension, cached as Parquet + JSON.

The extension (PyPI ``duckdb-extension-tpcds``) loads only into duckdb 1.5.5, and the project's
tests pin a newer DuckDB (the reference engine), so generation runs once per scale factor in a
subprocess of the ``.venv-tpcds`` interpreter (``make .venv-tpcds``; ``$OPFORGE_TPCDS_PYTHON``
names another) through ``tpcds/dsdgen.py``. It writes into a private folder that is renamed into
place, so concurrent callers never see half a data set.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from opforge.sql.tpch.data import build_once, sf_label

GENERATOR = Path(__file__).with_name("dsdgen.py")
REPO = Path(__file__).resolve().parents[4]
MAKE_TARGET = "make .venv-tpcds"


def data_dir(sf: float, root: str | os.PathLike | None = None) -> Path:
    """``<root>/sf<sf>``; root defaults to ``$OPFORGE_CACHE_DIR/tpcds``."""
    if root is None:
        from opforge.runtime.cache import default_cache_dir

        root = default_cache_dir() / "tpcds"
    return Path(root) / sf_label(sf)


def generator_python() -> Path:
    """The interpreter with duckdb 1.5.5 and the tpcds extension."""
    named = os.environ.get("OPFORGE_TPCDS_PYTHON")
    candidates = [Path(named)] if named else [Path.cwd() / ".venv-tpcds" / "bin" / "python",
                                              REPO / ".venv-tpcds" / "bin" / "python"]
    for path in candidates:
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"tpcds: no generator venv at {', '.join(map(str, candidates))}; build it with `{MAKE_TARGET}` "
        "(duckdb 1.5.5 + duckdb-extension-tpcds) or set OPFORGE_TPCDS_PYTHON")


def _manifest(directory: Path) -> dict | None:
    try:
        manifest = json.loads((directory / "manifest.json").read_text())
    except (OSError, ValueError):
        return None
    files = [directory / e["file"] for e in manifest["tables"].values()] + [directory / "queries.json"]
    return manifest if all(f.is_file() for f in files) else None


def _dsdgen(work: Path, sf: float) -> None:
    done = subprocess.run([str(generator_python()), str(GENERATOR), str(work), f"{float(sf)!r}"],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"tpcds: dsdgen failed (exit {done.returncode}):\n{done.stderr[-2000:]}")


def generate(sf: float = 0.01, root: str | os.PathLike | None = None) -> dict[str, Path]:
    """Generate TPC-DS at scale factor ``sf`` once; returns ``{table: parquet_path}``."""
    target = data_dir(sf, root)
    build_once(target, _manifest, lambda work: _dsdgen(work, sf))
    manifest = _manifest(target)
    return {name: target / entry["file"] for name, entry in manifest["tables"].items()}


def queries(sf: float = 0.01, root: str | os.PathLike | None = None) -> dict[int, str]:
    """The 99 queries, ``{number: text}`` (generated with the data)."""
    generate(sf, root)
    text = json.loads((data_dir(sf, root) / "queries.json").read_text())
    return {int(n): q for n, q in sorted(text.items(), key=lambda kv: int(kv[0]))}


def name(n: int) -> str:
    return f"q{n:02d}"

"""The README's Python examples run, so they cannot drift from the code again
(issue 25: its first example needed CUDA with no CPU variant).

Every ```python block of README.md runs, in order and in one namespace (a
block may use what an earlier one imported), in a fresh interpreter set up as a
user's would be (no ``OPFORGE_INTERPRET``, a throw-away autotune cache), on the
CPU when there is no GPU, in a folder holding a small ``lineitem.parquet`` for
the SQL example. A block that cannot run here says so on its first line:

    # readme-test: skip (needs a GPU)

and is skipped only when the reason still holds (``needs a GPU`` runs when CUDA
is there). Keep such blocks few. Blocks under the placement driver's section
(a heading naming ``placement`` or ``pd``) belong to that section's owner: a
failure there is reported as an expected failure, not an error, for now.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
MARKER = re.compile(r"^#\s*readme-test:\s*skip\s*\((?P<why>[^)]*)\)\s*$")
KNOWN_REASONS = {"needs a GPU": lambda: not torch.cuda.is_available()}
MAX_SKIPPED = 2
PLACEMENT_HEADING = re.compile(r"\bplacement\b|`pd\b|\bpd\b", re.IGNORECASE)


def python_blocks(text: str) -> list[dict]:
    """Each ```python block: its first line number, section heading and code."""
    blocks, heading, code, start = [], "", None, 0
    for n, line in enumerate(text.splitlines(), 1):
        if code is None and line.startswith("#"):
            heading = line.lstrip("#").strip()
        if code is None and line.strip() == "```python":
            code, start = [], n + 1
        elif code is not None and line.strip() == "```":
            blocks.append({"line": start, "heading": heading, "code": "\n".join(code) + "\n"})
            code = None
        elif code is not None:
            code.append(line)
    return blocks


def skip_reason(block: dict) -> str | None:
    first = block["code"].lstrip().splitlines()[0] if block["code"].strip() else ""
    m = MARKER.match(first)
    if not m:
        return None
    why = m.group("why").strip()
    assert why in KNOWN_REASONS, f"README line {block['line']}: unknown skip reason {why!r} ({set(KNOWN_REASONS)})"
    return why if KNOWN_REASONS[why]() else None


RUNNER = r"""
import json, sys, traceback
blocks = json.load(open(sys.argv[1]))
ns = {"__name__": "__readme__"}
results = []
for b in blocks:
    try:
        exec(compile(b["code"], f"README.md:{b['line']}", "exec"), ns)
        results.append({"line": b["line"], "ok": True})
    except BaseException:
        results.append({"line": b["line"], "ok": False, "error": traceback.format_exc()[-3000:]})
json.dump(results, open(sys.argv[2], "w"))
"""


def _lineitem(path: Path) -> None:
    pq.write_table(pa.table({"l_returnflag": ["A", "N", "R", "N", "A"], "l_quantity": [1.0, 2.0, 3.0, 4.0, 5.0]}),
                   path)


def test_the_readme_has_python_examples_and_few_skips():
    blocks = python_blocks(README.read_text())
    assert len(blocks) >= 3
    marked = [b for b in blocks if MARKER.match((b["code"].lstrip().splitlines() or [""])[0])]
    assert len(marked) <= MAX_SKIPPED, [b["line"] for b in marked]


def test_the_readme_python_examples_run(tmp_path):
    blocks = python_blocks(README.read_text())
    run = [b for b in blocks if skip_reason(b) is None]
    _lineitem(tmp_path / "lineitem.parquet")
    (tmp_path / "blocks.json").write_text(json.dumps(run))
    (tmp_path / "runner.py").write_text(RUNNER)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPFORGE_", "TRITON_INTERPRET"))}
    env.update(PYTHONPATH=str(REPO / "src"), OPFORGE_CACHE_DIR=str(tmp_path / "cache"), OPFORGE_AUTOTUNE="off")
    p = subprocess.run([sys.executable, "runner.py", "blocks.json", "results.json"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    results = {r["line"]: r for r in json.loads((tmp_path / "results.json").read_text())}
    failed = [b for b in run if not results[b["line"]]["ok"]]
    ours = [b for b in failed if not PLACEMENT_HEADING.search(b["heading"])]
    report = "\n\n".join(f"README.md line {b['line']} ({b['heading']!r}):\n{results[b['line']]['error']}"
                         for b in failed)
    assert not ours, report
    if failed:
        pytest.xfail("placement section examples fail (owned by the placement work):\n" + report)

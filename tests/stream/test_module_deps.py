"""Module dependencies of the stream package (issue 22): no import loop
between the DataStream API and the joins; trigger decisions live in the
trigger classes, not in ``kind`` strings read by the operators."""

import ast
from pathlib import Path

import opforge.stream

STREAM = Path(opforge.stream.__file__).parent


def _imports(name):
    tree = ast.parse((STREAM / name).read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def test_joins_do_not_import_the_datastream_api():
    assert "opforge.stream.datastream" not in _imports("joins.py")
    assert "opforge.stream.datastream" not in _imports("columnar_join.py")


def test_no_operator_reads_a_trigger_kind():
    for path in STREAM.glob("*.py"):
        text = path.read_text()
        assert "trigger.kind" not in text and "default_trigger =" not in text, path.name

"""pyproject's requirements say what the README and requirements-pins.txt say
(issue 25: pyproject allowed triton>=3.3 and any numpy while the README called
the 3.6 / numpy<2.3 pins required).

triton 3.6.x is what opforge is tuned and tested with (the shipped tuned tables
are keyed by it); numpy<2.3 is needed by the Triton 3.6 *interpreter* only
(the tests, ``OPFORGE_INTERPRET=1``), so it is a pin of the ``dev`` extra,
while GPU use works with newer numpy (the H200 set-up runs numpy 2.5)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
# The set-ups opforge is run on: CI / laptops (requirements-pins.txt) and the lent H200.
H200 = {"torch": "2.11.0", "triton": "3.6.0", "numpy": "2.5.2"}


def _reqs(lines) -> dict[str, Requirement]:
    return {r.name: r for r in map(Requirement, lines)}


def _pins() -> dict[str, str]:
    out = {}
    for line in (REPO / "requirements-pins.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)==([^;\s]+)", line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


def test_the_ci_pins_satisfy_pyproject():
    core, dev = _reqs(PROJECT["dependencies"]), _reqs(PROJECT["optional-dependencies"]["dev"])
    for name, version in _pins().items():
        for reqs in (core, dev):
            if name in reqs:
                assert reqs[name].specifier.contains(Version(version)), (name, version, str(reqs[name]))


def test_the_h200_set_up_satisfies_the_core_requirements():
    core = _reqs(PROJECT["dependencies"])
    for name, version in H200.items():
        assert core[name].specifier.contains(Version(version)), (name, version, str(core[name]))


def test_triton_is_pinned_to_the_tested_minor_and_numpy_below_2_3_for_the_interpreter():
    core, dev = _reqs(PROJECT["dependencies"]), _reqs(PROJECT["optional-dependencies"]["dev"])
    assert not core["triton"].specifier.contains(Version("3.3.0"))
    assert core["triton"].specifier.contains(Version("3.6.0"))
    assert not core["triton"].specifier.contains(Version("3.7.0"))
    assert "numpy" in dev and not dev["numpy"].specifier.contains(Version("2.3.0"))
    assert dev["numpy"].specifier.contains(Version("2.2.6"))
    readme = (REPO / "README.md").read_text()
    assert "triton>=3.6,<3.7" in readme and "numpy<2.3" in readme

"""The bench families: found, not listed.

A bench family is a module of :mod:`opforge.bench` that defines a top-level
``cases(device, quick) -> list[BenchCase]`` (and, optionally,
``crossover_cases(device, quick)``). Adding a family is adding that one module:
``opforge bench``, ``--prewarm`` workers, ``opforge tune --preset bench`` and
``opforge profile --case`` all find it here, as the placement simulator finds
its cases (``placement/simulator/cases``) through :mod:`pkgutil`.

Which modules are families is read from their source (a top-level ``def
cases``), so the support modules (harness, prewarm, plot, ...) are never
imported just to be looked at. A family's name is its module's name; they are
listed in alphabetical order, which is the order a full bench run takes.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import pkgutil
from pathlib import Path
from types import ModuleType

PACKAGE = "opforge.bench"


def _package_path() -> list[str]:
    return list(importlib.import_module(PACKAGE).__path__)


def _defines_cases(path: str) -> bool:
    tree = ast.parse(Path(path).read_text(encoding="utf-8"), filename=path)
    return any(isinstance(node, ast.FunctionDef) and node.name == "cases" for node in tree.body)


@functools.cache
def names() -> tuple[str, ...]:
    """Every family's name, sorted."""
    found = []
    for info in pkgutil.iter_modules(_package_path()):
        if info.name.startswith("_") or info.ispkg:
            continue
        spec = importlib.util.find_spec(f"{PACKAGE}.{info.name}")
        if spec is not None and spec.origin and spec.origin.endswith(".py") and _defines_cases(spec.origin):
            found.append(info.name)
    return tuple(sorted(found))


def get(name: str) -> ModuleType:
    """The family module ``name``; a ``ValueError`` names the families for a wrong one."""
    if name not in names():
        raise ValueError(f"unknown bench family {name!r}; families: {', '.join(names())}")
    return importlib.import_module(f"{PACKAGE}.{name}")


def all_families() -> dict[str, ModuleType]:
    """Name -> module for every family, imported."""
    return {n: get(n) for n in names()}


def family_cases(name: str, where: str, device, quick: bool) -> list:
    """The family's ``entries`` (its ``cases``) or ``crossover`` list (its
    ``crossover_cases``, empty when it has none)."""
    mod = get(name)
    if where == "entries":
        return list(mod.cases(device, quick))
    if where == "crossover":
        fn = getattr(mod, "crossover_cases", None)
        return list(fn(device, quick)) if fn is not None else []
    raise ValueError(f"case list {where!r} is not 'entries' or 'crossover'")

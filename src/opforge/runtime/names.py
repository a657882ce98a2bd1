"""Objects named ``"module:qualname"``: how a child process (a compile or ncu
job) finds a kernel or a step factory, and how a checkpoint finds a record
class again. Only importable names work: nothing defined in ``__main__`` or
inside a function."""

from __future__ import annotations

import importlib


def resolve(name: str):
    """The object ``"module:qual.name"`` names, importing the module."""
    module, _, qual = name.partition(":")
    obj = importlib.import_module(module)
    for part in qual.split("."):
        obj = getattr(obj, part)
    return obj

"""Restoring a checkpoint constructs only registered state types: a crafted
``state.json`` naming any other class fails with ``CheckpointRestoreError``
before its module is imported (issue 25)."""

import json
import sys
from collections import namedtuple
from dataclasses import dataclass

import pytest

from opforge.stream import CheckpointRestoreError
from opforge.stream.checkpoint import StateEncoder, decode, register_state_type


def test_a_crafted_dataclass_entry_imports_nothing():
    name = "antigravity"
    assert name not in sys.modules
    for tag in ("$dc", "$nt"):
        doc = {tag: f"{name}:geohash", "v": {"a": 1} if tag == "$dc" else [1]}
        with pytest.raises(CheckpointRestoreError, match="not a registered state type") as e:
            decode(json.loads(json.dumps(doc)), {})
        assert name in str(e.value) and "register_state_type" in str(e.value)
        assert name not in sys.modules


def test_an_imported_but_unregistered_dataclass_is_refused():
    doc = {"$dc": "opforge.stream.checkpoint:CheckpointConfig", "v": {"interval_ms": 0, "checkpoint_dir": "/x"}}
    with pytest.raises(CheckpointRestoreError, match="not a registered state type"):
        decode(doc, {})


@dataclass
class Registered:
    a: int


Pair = namedtuple("Pair", "x y")


def test_registered_and_encoded_types_round_trip():
    register_state_type(Registered)
    doc = {"$dc": f"{__name__}:Registered", "v": {"a": 3}}
    assert decode(doc, {}) == Registered(3)
    enc = StateEncoder()
    out = json.loads(json.dumps(enc.encode([Pair(1, 2)], "t")))  # encoding a type registers it
    assert decode(out, {}) == [Pair(1, 2)]
    with pytest.raises(TypeError, match="dataclass or a namedtuple"):
        register_state_type(int)

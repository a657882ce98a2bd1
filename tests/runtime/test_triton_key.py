"""The memoized Triton installation hash (``runtime/triton_key``): the key it gives is
Triton's own, a process with an index entry for this installation reads it instead of hashing
``libtriton.so``, and an entry for another fingerprint is never used."""

import json

import pytest
import triton.runtime.cache as cache

from opforge.runtime import triton_key as tk


@pytest.fixture
def tritons(tmp_path, monkeypatch):
    """(Triton's own key function, its key), with an empty cache folder and Triton's function
    back in place (``install`` wraps whatever is there)."""
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(tmp_path))
    original = getattr(cache.triton_key, "__wrapped_triton_key__", cache.triton_key)
    monkeypatch.setattr(cache, "triton_key", original)
    return original, original()


def test_first_process_records_tritons_key(tritons):
    original, key = tritons
    tk.install()
    assert cache.triton_key is not original and cache.triton_key() == key
    doc = json.loads(tk.index_path().read_text())
    assert doc["entries"] == {tk.fingerprint(): key}
    assert cache.get_cache_key.__globals__["triton_key"]() == key  # what Triton's cache keys call


def test_a_later_process_reads_the_index_and_hashes_nothing(tritons, monkeypatch):
    _, key = tritons
    tk._write_index({tk.fingerprint(): key})

    def hashing():
        raise AssertionError("recomputed Triton's key")

    monkeypatch.setattr(cache, "triton_key", hashing)  # this process has not hashed yet
    tk.install()
    assert cache.triton_key() == key


def test_an_entry_for_another_installation_is_not_used(tritons):
    _, key = tritons
    tk._write_index({"another-fingerprint": "stale"})
    tk.install()
    assert cache.triton_key() == key
    assert json.loads(tk.index_path().read_text())["entries"] == {"another-fingerprint": "stale",
                                                                   tk.fingerprint(): key}

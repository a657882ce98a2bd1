"""The Gluon transpose steps compile for sm_90 without a GPU, issue exactly the memory
instructions the analyzer models, and Triton's own bank-conflict count for Gluon
shared layouts built from ``opforge.layout`` swizzles equals the analyzer's."""

import os
import re
import sys

import pytest
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from opforge.layout import Layout, LayoutError, Swizzle
from opforge.layout import analyze as A
from opforge.layout import gluon as G

EXAMPLES = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
POINTERS = {"x_ptr": "*fp32", "y_ptr": "*fp32", "M": "i32", "N": "i32"}


@pytest.fixture(scope="module")
def transpose_gluon():
    sys.path.insert(0, EXAMPLES)
    try:
        import transpose_gluon

        yield transpose_gluon
    finally:
        sys.path.remove(EXAMPLES)


def test_swizzle_parameters_round_trip():
    assert G.swizzle_params(Swizzle(5, 0, 5), 32, 32) == (1, 1, 32)
    assert G.swizzle_params(Swizzle(3, 2, 3), 16, 32) == (4, 1, 8)  # 16-byte vectors, 8 phases
    assert G.swizzle_params(Swizzle(2, 1, 5), 32, 32) == (2, 2, 4)
    for vec, per_phase, max_phase in [(1, 1, 32), (4, 1, 8), (2, 2, 4), (8, 1, 4)]:
        assert G.swizzle_params(G.swizzle_of(vec, per_phase, max_phase, 32), 32, 32) == (vec, per_phase, max_phase)
    assert G.padding_params(Layout((32, 32), (33, 1))) == (32, 1)
    with pytest.raises(LayoutError, match="M\\+S >= log2"):
        G.swizzle_params(Swizzle(3, 0, 3), 32, 32)
    with pytest.raises(LayoutError, match="must lie in a row"):
        G.swizzle_params(Swizzle(4, 3, 4), 32, 16)
    with pytest.raises(LayoutError, match="padding must be a power of two"):
        G.padding_params(Layout((32, 32), (35, 1)))


def _count(ptx: str, pattern: str) -> int:
    return len(re.findall(pattern, ptx))


@pytest.mark.fresh_process
@pytest.mark.parametrize("kind", ["naive", "unpadded", "padded", "swizzled"])
def test_transpose_steps_compile_for_sm90_to_the_modelled_instructions(transpose_gluon, kind):
    kernel, kw = transpose_gluon.launch_args(kind)
    kw = dict(kw)
    warps = kw.pop("num_warps")
    ptx = G.compile_ptx(kernel, POINTERS, kw, num_warps=warps)
    predicted = A.predict(transpose_gluon.accesses(kind, 256, 512))
    # every thread issues one 4-byte instruction per request of its warp
    for space, op in [("global", "ld"), ("global", "st"), ("shared", "ld"), ("shared", "st")]:
        per_thread = _count(ptx, rf"\b{op}\.{space}\.b32\b")
        assert per_thread * warps == predicted.get(f"{space}_{op}_requests", 0), (space, op)
    assert _count(ptx, r"(ld|st)\.(shared|global)\.v\d") == 0  # no vector accesses: 4 bytes per lane
    assert _count(ptx, r"(ld|st)matrix") == 0


@gluon.jit
def _conflict_probe(x_ptr, VEC: gl.constexpr, PER_PHASE: gl.constexpr, MAX_PHASE: gl.constexpr,
                    STORE: gl.constexpr, LOAD: gl.constexpr):
    rows: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [4, 1], [1, 0])
    r = gl.arange(0, 32, layout=gl.SliceLayout(1, rows))
    c = gl.arange(0, 32, layout=gl.SliceLayout(0, rows))
    tile = gl.load(x_ptr + r[:, None] * 32 + c[None, :])
    smem = gl.allocate_shared_memory(gl.float32, [32, 32], gl.SwizzledSharedLayout(VEC, PER_PHASE, MAX_PHASE, [1, 0]))
    gl.static_assert(gl.bank_conflicts(tile.type, smem.type) == STORE)
    gl.static_assert(gl.bank_conflicts(tile.type, smem.permute([1, 0]).type) == LOAD)


@pytest.mark.fresh_process
@pytest.mark.parametrize("swizzle, load_conflicts", [
    (Swizzle(5, 0, 5), 0), (Swizzle(0, 0, 5), 31), (Swizzle(3, 0, 5), 3), (Swizzle(2, 1, 5), 7)])
def test_analyzer_agrees_with_tritons_bank_conflict_model(swizzle, load_conflicts):
    tile = G.swizzled_tile(swizzle, 32, 32)
    along_rows = Layout((32, (4, 8)), (32, (1, 4)))
    down_cols = Layout((32, (4, 8)), (1, (32, 128)))
    got = A.predict([A.tile_access("st", "shared", "st", along_rows, tile, element_bytes=4),
                     A.tile_access("ld", "shared", "ld", down_cols, tile, element_bytes=4)])
    assert got["shared_ld_conflicts_per_request"] == load_conflicts
    vec, per_phase, max_phase = G.swizzle_params(swizzle, 32, 32)
    # compiling fails unless Triton counts the same conflicts for the store and the transposed read
    G.compile_ptx(_conflict_probe, {"x_ptr": "*fp32"},
                  {"VEC": vec, "PER_PHASE": per_phase, "MAX_PHASE": max_phase,
                   "STORE": int(got["shared_st_conflicts_per_request"]), "LOAD": load_conflicts}, num_warps=4)


def test_a_ladder_row_with_declared_accesses_shows_the_prediction(transpose_gluon):
    from rich.console import Console

    from opforge.profile import report as R
    from opforge.profile.compare import _layout_analysis

    rows = [R.make_row(f"gluon {kind}", layout=_layout_analysis(transpose_gluon.accesses(kind, 64, 64)))
            for kind in ("naive", "unpadded", "swizzled")]
    rows.append(R.make_row("no layouts declared"))
    rep = R.new_report("ladder", "transpose", rows)
    assert rows[1]["layout"]["predicted"]["shared_ld_conflicts_per_request"] == 31.0
    assert rows[2]["layout"]["predicted"]["shared_ld_conflicts_per_request"] == 0.0
    console = Console(record=True, width=200)
    R.print_report(rep, console)
    text = console.export_text()
    assert "predicted by opforge.layout" in text
    lines = [ln for ln in text.splitlines() if "gluon unpadded" in ln and "load tile.T" in ln]
    assert len(lines) == 1 and "32.00" in lines[0] and "31.00" in lines[0]
    naive_store = [ln for ln in text.splitlines() if "gluon naive" in ln and "store y" in ln]
    assert len(naive_store) == 1 and "32.00" in naive_store[0]

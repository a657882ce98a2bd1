"""The access analyzer on cases worked out by hand: 32 banks of 4 bytes, 32-byte sectors."""

import pytest

from opforge.layout import Layout, Swizzle, row_swizzle
from opforge.layout import analyze as A


def shared(layout, element_bytes=4, width=None):
    return A.shared_cost(A.lane_addresses(layout, element_bytes), width or element_bytes)


def sectors(layout, element_bytes=4, width=None, base=0):
    return A.global_cost(A.lane_addresses(layout, element_bytes, base), width or element_bytes)


def test_row_and_column_of_a_32x32_fp32_tile():
    tile = Layout((32, 32), (32, 1))  # row-major, coordinates (row, col)
    row = lambda t: tile(0, t)  # noqa: E731 - lanes along a row: 32 consecutive words
    col = lambda t: tile(t, 0)  # noqa: E731 - lanes down a column: 128 bytes apart, all in bank 0
    assert shared(row) == A.SharedCost(1, 1)
    assert shared(col) == A.SharedCost(32, 1) and shared(col).conflicts == 31
    assert sectors(row) == A.GlobalCost(4, 1)
    assert sectors(col) == A.GlobalCost(32, 32)


def test_padding_by_one_word_and_an_xor_swizzle_are_conflict_free():
    padded = Layout((32, 32), (33, 1))
    assert shared(lambda t: padded(t, 0)) == A.SharedCost(1, 1)  # banks 0, 1, ..., 31
    swizzled = row_swizzle(32, 32, Swizzle(5, 0, 5))  # col ^ row
    assert shared(lambda t: swizzled(t, 0)) == A.SharedCost(1, 1)
    assert shared(lambda t: swizzled(0, t)) == A.SharedCost(1, 1)
    partly = row_swizzle(32, 32, Swizzle(3, 0, 5))  # only 8 phases: 4 rows share each bank
    assert shared(lambda t: partly(t, 0)) == A.SharedCost(4, 1)


def test_stride_two_words_is_a_two_way_conflict_and_a_broadcast_is_free():
    assert shared(Layout(32, 2)) == A.SharedCost(2, 1)
    assert shared(Layout(32, 0)) == A.SharedCost(1, 1)  # every lane reads one word
    assert shared(Layout((2, 16), (0, 1))) == A.SharedCost(1, 1)  # pairs of lanes share words


@pytest.mark.parametrize("width, ideal", [(8, 2), (16, 4)])
def test_wide_accesses_are_split_into_phases(width, ideal):
    # contiguous vectors: each half-warp (8 B) or quarter-warp (16 B) covers 128 bytes once
    contiguous = Layout(32, width // 4)
    assert shared(contiguous, width=width) == A.SharedCost(ideal, ideal)
    # 16-byte vectors 256 bytes apart: the 8 lanes of a quarter-warp hit the same 4 banks, 8 words each
    spread = Layout(32, 64)
    cost = shared(spread, width=16)
    assert cost == A.SharedCost(4 * 8, 4) and cost.conflicts == 28


def test_global_sectors_and_lines():
    assert sectors(Layout(32, 1), element_bytes=2) == A.GlobalCost(2, 1)  # 64 contiguous bytes
    assert sectors(Layout(32, 1), base=16) == A.GlobalCost(5, 2)  # misaligned by half a sector
    assert sectors(Layout(32, 4), width=16) == A.GlobalCost(16, 4)  # 16 B per lane: 512 bytes
    assert sectors(Layout(32, 2)) == A.GlobalCost(8, 2)  # every other word: same sectors as dense 256 B


def test_tile_access_and_predict():
    # a 4-warp program moving an 8x32 tile along its rows: 8 requests, coalesced
    along_rows = Layout((32, 8), (8, 1))  # lane -> col, request -> row (column-major tile index)
    rows = A.tile_access("x", "global", "ld", along_rows, Layout((8, 32), (1024, 1)), element_bytes=4)
    down = A.tile_access("t", "shared", "ld", Layout((32, 8), (1, 32)), Layout((32, 8), (8, 1)), element_bytes=4)
    p = A.predict([rows, down])
    assert p["global_ld_requests"] == 8 and p["global_ld_sectors_per_request"] == 4.0
    # lanes down a column of a 32x8 row-major fp32 tile: words 8 apart, 4 lanes per bank
    assert p["shared_ld_requests"] == 8 and p["shared_ld_wavefronts_per_request"] == 8.0
    assert p["shared_ld_conflicts_per_request"] == 7.0


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="access width"):
        A.shared_cost([0] * 32, 32)
    with pytest.raises(ValueError, match="misaligned"):
        A.shared_cost([2] * 32, 4)
    with pytest.raises(ValueError, match="space must be"):
        A.Access("x", "local", "ld", 4)

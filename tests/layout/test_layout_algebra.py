"""opforge.layout's algebra: CuTe's documented examples reproduced exactly (CUTLASS
media/docs/cpp/cute/02_layout_algebra.md), and the laws checked on random layouts
against the layouts evaluated point by point."""

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from opforge.layout import (ComposedLayout, Layout, LayoutError, Swizzle, blocked_product, coalesce, complement,
                            composition, flat_divide, left_inverse, logical_divide, logical_product, make_layout,
                            raked_product, right_inverse, tiled_divide, tiled_product, zipped_divide, zipped_product)
from opforge.layout.inttuple import is_int, product

L = Layout
SETTINGS = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])


# ---------------------------------------------------------------------------
# CuTe's worked examples
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("layout, profile, expected", [
    (L((2, (1, 6)), (1, (6, 2))), None, "12:1"),
    (L((2, (1, 6)), (1, (6, 2))), (1, 1), "(2,6):(1,2)"),
])
def test_coalesce_examples(layout, profile, expected):
    assert str(coalesce(layout, profile)) == expected


@pytest.mark.parametrize("a, b, expected", [
    (L((6, 2), (8, 2)), L((4, 3), (3, 1)), "((2,2),3):((24,2),8)"),
    (L(20, 2), L((5, 4), (4, 1)), "(5,4):(8,2)"),
    (L((10, 2), (16, 4)), L((5, 4), (1, 5)), "(5,(2,2)):(16,(80,4))"),
    (L((12, (4, 8)), (59, (13, 1))), (L(3, 4), L(8, 2)), "(3,(2,4)):(236,(26,1))"),  # by-mode (tiler)
    (L((12, (4, 8)), (59, (13, 1))), (3, 8), "(3,(4,2)):(59,(13,1))"),  # a shape as tiler
])
def test_composition_examples(a, b, expected):
    assert str(composition(a, b)) == expected


@pytest.mark.parametrize("a, expected", [
    (L(4, 1), "6:4"), (L(6, 4), "4:1"), (L((4, 6), (1, 4)), "1:0"), (L(4, 2), "(2,3):(1,8)"),
    (L((2, 4), (1, 6)), "3:2"), (L((2, 2), (1, 6)), "(3,2):(2,12)"),
])
def test_complement_examples(a, expected):
    assert str(complement(a, 24)) == expected


def test_divide_examples():
    assert str(logical_divide(L((4, 2, 3), (2, 1, 8)), L(4, 2))) == "((2,2),(2,3)):((4,1),(2,8))"
    a, tiler = L((9, (4, 8)), (59, (13, 1))), (L(3, 3), L((2, 4), (1, 8)))
    assert str(logical_divide(a, tiler)) == "((3,3),((2,4),(2,2))):((177,59),((13,2),(26,1)))"
    zd = zipped_divide(a, tiler)
    assert str(zd) == "((3,(2,4)),(3,(2,2))):((177,(13,2)),(59,(26,1)))"
    assert str(zd.mode(0)) == str(composition(a, tiler))  # layout<0>(zipped_divide(a, b)) == composition(a, b)
    assert str(tiled_divide(a, tiler)) == "((3,(2,4)),3,(2,2)):((177,(13,2)),59,(26,1))"
    assert str(flat_divide(a, tiler)) == "(3,(2,4),3,(2,2)):(177,(13,2),59,(26,1))"


def test_product_examples():
    assert str(logical_product(L((2, 2), (4, 1)), L(6, 1))) == "((2,2),(2,3)):((4,1),(2,8))"
    a, b = L((2, 5), (5, 1)), L((3, 4), (1, 3))
    # the docs' 2x5 row-major tile in a 3x4 column-major arrangement: ((2,3),(5,4)):((5,10),(1,30)),
    # mode 0 coalesced (as CuTe's blocked_product does) to 6:5
    blocked = blocked_product(a, b)
    assert str(blocked) == "(6,(5,4)):(5,(1,30))"
    assert _same(blocked, L(((2, 3), (5, 4)), ((5, 10), (1, 30))))
    assert str(raked_product(a, b)) == "((3,2),(4,5)):((10,5),(30,1))"
    # by-mode products regrouped: ((M, N), (TileM, TileN)) and ((M, N), TileM, TileN)
    a, tiler = L((2, 5), (5, 1)), (L(3, 1), L(4, 1))
    reps = [logical_product(a.mode(i), tiler[i]).mode(1) for i in range(2)]
    assert [str(r) for r in reps] == ["3:1", "4:5"]  # 3:1 fills the holes of 2:5, 4:5 repeats 5:1
    assert str(zipped_product(a, tiler)) == "((2,5),(3,4)):((5,1),(1,5))"
    assert str(tiled_product(a, tiler)) == "((2,5),3,4):((5,1),1,5)"


def test_undefined_operations_name_their_condition():
    with pytest.raises(LayoutError, match="stride divisibility"):
        composition(L((6, 2), (1, 10)), L(2, 4))
    with pytest.raises(LayoutError, match="shape divisibility"):
        composition(L((4, 3), (1, 10)), L(6, 1))
    with pytest.raises(LayoutError, match="not injective"):
        complement(L((2, 2), (2, 3)), 24)
    with pytest.raises(ValueError, match="not congruent"):
        L((2, 3), 1)
    with pytest.raises(ValueError, match="B and M"):
        Swizzle(-1, 0, 3)
    with pytest.raises(ValueError, match="must be >= B"):
        Swizzle(3, 0, 2)


def test_calls_and_sizes():
    a = L((2, (3, 4)), (1, (2, 6)))
    assert (a.size(), a.cosize(), a.rank(), a.depth()) == (24, 24, 2, 2)
    assert a(1, (2, 3)) == 1 + 4 + 18 == a(1 + 2 * 2 + 2 * 3 * 3)  # natural coordinate == 1-D index
    assert a.coordinate(23) == (1, (2, 3))
    assert a(1, 11) == a(1, (2, 3))


# ---------------------------------------------------------------------------
# laws on random layouts
# ---------------------------------------------------------------------------
def _same(x, y) -> bool:
    return x.size() == y.size() and all(x(i) == y(i) for i in range(x.size()))


def _compatible(shape, other) -> bool:
    """Every coordinate of ``shape`` is a coordinate of ``other`` (CuTe's ``compatible``)."""
    if is_int(shape):
        return shape == product(other)
    return not is_int(other) and len(shape) == len(other) and all(_compatible(a, b) for a, b in zip(shape, other))


sizes = st.sampled_from([1, 2, 3, 4, 6])
pow2 = st.sampled_from([1, 2, 4, 8])


@st.composite
def layouts(draw, max_modes=3, nested=True, stride=st.integers(0, 12)):
    n = draw(st.integers(1, max_modes))
    modes = []
    for _ in range(n):
        if nested and draw(st.booleans()):
            k = draw(st.integers(1, 2))
            modes.append(L(tuple(draw(sizes) for _ in range(k)), tuple(draw(stride) for _ in range(k))))
        else:
            modes.append(L(draw(sizes), draw(stride)))
    out = make_layout(*modes) if n > 1 else modes[0]
    assume(out.size() <= 256)
    return out


@st.composite
def injective(draw, max_modes=3):
    """A tiling-style injective layout: sorted by stride, each stride a multiple of the extent
    below it, then its modes shuffled."""
    n = draw(st.integers(1, max_modes))
    leaves, extent = [], 1
    for _ in range(n):
        s = draw(st.sampled_from([2, 3, 4]))
        d = extent * draw(st.sampled_from([1, 1, 2]))
        leaves.append((s, d))
        extent = s * d
    leaves = draw(st.permutations(leaves))
    return L(tuple(s for s, _ in leaves), tuple(d for _, d in leaves)) if n > 1 else L(*leaves[0])


@SETTINGS
@given(layouts())
def test_coalesce_preserves_the_function(a):
    c = coalesce(a)
    assert c.depth() <= 1 and _same(a, c)


@st.composite
def composable(draw):
    """A ``B`` that CuTe's composition is defined for: one mode ``s:d``, or a compact
    (column-major) reshape of some shape; it never reaches past ``size(A)`` = 512."""
    if draw(st.booleans()):
        return L(draw(sizes), draw(st.sampled_from([0, 1, 2, 3, 4, 8])))
    shape = draw(layouts(stride=st.just(1))).shape
    return L(shape)


def _within(a, b) -> bool:
    return max(b.indices()) < a.size()


@SETTINGS
@given(layouts(stride=st.sampled_from([0, 1, 2, 4, 8, 16])), composable())
def test_composition_has_b_shape_and_is_a_after_b(a, b):
    assume(_within(a, b))
    try:
        r = composition(a, b)
    except LayoutError:
        assume(False)
    assert _compatible(b.shape, r.shape)
    assert all(r(i) == a(b(i)) for i in range(b.size()))


@SETTINGS
@given(layouts(stride=st.sampled_from([1, 2, 4, 8])), composable(), composable())
def test_composition_is_associative_where_defined(a, b, c):
    assume(_within(a, b) and _within(b, c))
    try:
        left, right = composition(composition(a, b), c), composition(a, composition(b, c))
    except LayoutError:
        assume(False)
    assert all(left(i) == right(i) == a(b(c(i))) for i in range(c.size()))


@SETTINGS
@given(injective(), st.sampled_from([1, 2, 3]))
def test_complement_is_ordered_disjoint_and_completes(a, extra):
    m = a.cosize() * extra
    r = complement(a, m)
    image = set(a.indices())
    assert all(r(i - 1) < r(i) for i in range(1, r.size()))  # ordered
    assert all(r(i) not in image for i in range(1, r.size()))  # disjoint codomains (0 is shared)
    joint = make_layout(a, r)
    assert joint.cosize() >= m and len(set(joint.indices())) == joint.size()  # completes A, injectively


@SETTINGS
@given(layouts(nested=False, stride=st.sampled_from([1, 2, 4])), injective(max_modes=2))
def test_logical_divide_is_composition_with_the_tiler_and_its_complement(a, b):
    try:
        d = logical_divide(a, b)
        expected = composition(a, make_layout(b, complement(b, a.size())))
        tile = composition(a, b)
    except LayoutError:
        assume(False)
    assert _same(d, expected)
    assert _same(d.mode(0), tile)  # mode 0: the elements the tiler selects


@SETTINGS
@given(injective(max_modes=2), injective(max_modes=2))
def test_logical_product_repeats_a(a, b):
    try:
        p = logical_product(a, b)
    except LayoutError:  # A* o B undefined: A's complement rounds past cosize(B) (as in CuTe)
        assume(False)
    assert _same(p.mode(0), a) and p.size() == a.size() * b.size()
    assert len(set(p.indices())) == p.size()  # the repetitions of A never overlap


@SETTINGS
@given(injective())
def test_inverses(a):
    r, left = right_inverse(a), left_inverse(a)
    assert all(a(r(i)) == i for i in range(r.size()))
    assert all(left(a(i)) == i for i in range(a.size()))


@pytest.mark.parametrize("b, m, s", [(3, 0, 3), (2, 1, 5), (3, 4, 3), (1, 2, -2)])
def test_swizzle_is_an_involution_on_its_span(b, m, s):
    sw = Swizzle(b, m, s)
    span = 1 << (m + max(s, 0) + b + (-s if s < 0 else 0))
    assert sorted(sw(x) for x in range(span)) == list(range(span))
    assert all(sw(sw(x)) == x for x in range(span))


def test_swizzled_layout_composes_inside_the_swizzle():
    tile = ComposedLayout(Swizzle(3, 2, 3), 0, L((8, 32), (32, 1)))
    assert tile(1, 0) == 32 ^ (1 << 2) and tile(0, 5) == 5
    column = composition(tile, L(8, 1))  # the first column: rows 0..7
    assert [column(i) for i in range(8)] == [r * 32 + (r << 2) for r in range(8)]
    assert _same(logical_divide(tile, L(4, 2)).layout.mode(0), composition(tile.layout, L(4, 2)))

"""Exact 128-bit integers on the device, for DECIMAL(p, s) with 18 < p <= 38 (DuckDB's HUGEINT storage).

Torch has no int128, so a value is a row of an ``[n, 2]`` int64 tensor: column 0 the low 64 bits
(their bit pattern), column 1 the high 64 bits (signed). That is Arrow's decimal128 layout byte for
byte, so Arrow columns come in and go out without a per-value conversion.

Arithmetic splits values into limbs small enough that int64 never overflows: 32-bit limbs for sums
(a column of limbs sums exactly over up to 2^31 rows, which is how SUM stays exact with the plain
int64 segment reductions), 16-bit limbs for products (a limb product < 2^32). Every function here
is elementwise and branch-free over the rows, the same on the CPU and CUDA; tests check them against
Python ints."""
from __future__ import annotations

import torch

MASK32 = 0xFFFFFFFF
SIGN = -(1 << 63)  # the sign bit of an int64; lo ^ SIGN orders the low words as unsigned
LIMIT = 10 ** 38  # |value| < 10^38: the widest DECIMAL


# -- construction / host conversion -----------------------------------------------------------------
def from_int64(v: torch.Tensor) -> torch.Tensor:
    v = v.long()
    return torch.stack([v, v >> 63], dim=1)


def from_ints(values: list[int], device) -> torch.Tensor:
    """Python ints (each in [-2^127, 2^127)) as an [n, 2] tensor."""
    rows = [[_signed64(x & (2 ** 64 - 1)), x >> 64] for x in values]
    return torch.tensor(rows, dtype=torch.int64, device=device).reshape(len(values), 2)


def full(value: int, n: int, device) -> torch.Tensor:
    return from_ints([value], device).expand(n, 2).contiguous()


def to_ints(x: torch.Tensor) -> list[int]:
    """The values as Python ints (host)."""
    pairs = x.detach().cpu().tolist()
    return [(hi << 64) | (lo & (2 ** 64 - 1)) for lo, hi in pairs]


def _signed64(u: int) -> int:
    return u - (1 << 64) if u >= 1 << 63 else u


def lo(x: torch.Tensor) -> torch.Tensor:
    """The low words, contiguous: a strided view would reach kernels that read plain buffers (the
    Triton hash ops) as the interleaved words."""
    return x[:, 0].contiguous()


def hi(x: torch.Tensor) -> torch.Tensor:
    return x[:, 1].contiguous()


def fits_int64(x: torch.Tensor) -> torch.Tensor:
    """True where the value is an int64 (then it is ``lo(x)``)."""
    return hi(x) == (lo(x) >> 63)


# -- limbs ------------------------------------------------------------------------------------------
def limbs32(x: torch.Tensor) -> list[torch.Tensor]:
    """Four 32-bit limbs, least significant first; the top one signed: value = sum(l_i * 2^(32 i))."""
    a, b = lo(x), hi(x)
    return [a & MASK32, (a >> 32) & MASK32, b & MASK32, b >> 32]


def from_limbs32(limbs: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(value, overflow): limbs of any size (int64, carries pending) normalized; ``overflow`` where
    the value leaves 128 bits."""
    out, carry = [], torch.zeros_like(limbs[0])
    for i, limb in enumerate(limbs):
        t = limb + carry
        if i < 3:
            out.append(t & MASK32)
            carry = t >> 32  # floor division: negative carries propagate
        else:
            overflow = (t < -(1 << 31)) | (t >= (1 << 31))
            out.append(t)
    low = out[0] | (out[1] << 32)
    high = out[2] | (out[3] << 32)
    return torch.stack([low, high], dim=1), overflow


# -- arithmetic -------------------------------------------------------------------------------------
def neg(x: torch.Tensor) -> torch.Tensor:
    a, b = lo(x), hi(x)
    return torch.stack([-a, ~b + (a == 0).long()], dim=1)


def is_negative(x: torch.Tensor) -> torch.Tensor:
    return hi(x) < 0


def abs_(x: torch.Tensor) -> torch.Tensor:
    return torch.where(is_negative(x)[:, None], neg(x), x)


def add(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(a + b, overflow of 128 bits)."""
    return from_limbs32([p + q for p, q in zip(limbs32(a), limbs32(b))])


def sub(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return from_limbs32([p - q for p, q in zip(limbs32(a), limbs32(b))])


def _limbs16(m: torch.Tensor) -> torch.Tensor:
    """[n, 8] 16-bit limbs of a magnitude (read as unsigned 128 bits), least significant first."""
    shifts = torch.arange(0, 64, 16, device=m.device)
    return ((m[:, :, None] >> shifts) & 0xFFFF).reshape(len(m), 8)


def mul(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(a * b, overflow: the product's magnitude reaches 2^127). Schoolbook over 16-bit limbs of the
    magnitudes as whole-tensor ops (a few dozen launches, not one per limb pair: a one-row product,
    TPC-H q14's ``100.00 * SUM(...)``, costs launches, not bytes): the 64 limb products (< 2^32) in
    one outer product, summed along their anti-diagonals (< 2^35 a column) by the skew of a padded
    view, paired into 32-bit columns and their carries propagated; then the sign."""
    negative = is_negative(a) ^ is_negative(b)
    n = len(a)
    prods = _limbs16(abs_(a))[:, :, None] * _limbs16(abs_(b))[:, None, :]  # [n, 8, 8]
    # row i shifted right by i: pad rows to 17, flatten, refold as 16 wide; column k sums i + j = k
    skewed = torch.nn.functional.pad(prods, (0, 9)).reshape(n, 8 * 17)[:, :8 * 16].reshape(n, 8, 16)
    cols = skewed.sum(dim=1)  # [n, 16] columns of 16-bit weight, the last always 0
    pairs = cols[:, 0::2] + (cols[:, 1::2] << 16)  # [n, 8] columns of 32-bit weight, each < 2^52
    limbs, carry = [], torch.zeros(n, dtype=torch.int64, device=a.device)
    for k in range(8):
        t = pairs[:, k] + carry
        limbs.append(t & MASK32)
        carry = t >> 32
    overflow = (carry != 0) | (limbs[3] >= 1 << 31)  # magnitude >= 2^127
    for limb in limbs[4:]:
        overflow = overflow | (limb != 0)
    m = torch.stack([limbs[0] | (limbs[1] << 32), limbs[2] | (limbs[3] << 32)], dim=1)
    return torch.where(negative[:, None], neg(m), m), overflow


def _mul_small(m: torch.Tensor, c: int) -> torch.Tensor:
    """Non-negative ``m * c`` for 0 < c < 2^31 (the caller bounds the result below 2^127)."""
    limbs = limbs32(m)
    return from_limbs32([limb * c for limb in limbs])[0]


def divmod_small(m: torch.Tensor, d) -> tuple[torch.Tensor, torch.Tensor]:
    """``(m // d, m % d)`` of a magnitude (``m`` read as unsigned 128 bits) for 0 < d < 2^31, an int or
    a per-row tensor: long division over 32-bit limbs, top first (each step's dividend
    ``r * 2^32 + limb`` < 2^63)."""
    limbs = limbs32(m)
    limbs[3] = limbs[3] & MASK32  # unsigned: |-2^127| = 2^127
    r = torch.zeros_like(limbs[0])
    q = [None] * 4
    for i in (3, 2, 1, 0):
        cur = (r << 32) + limbs[i]
        q[i] = torch.div(cur, d, rounding_mode="floor")
        r = cur - q[i] * d
    return from_limbs32(q)[0], r


def div_count_half_even(x: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """``x / count`` per row (1 <= count < 2^31) rounded half to even (DuckDB's decimal_average);
    exact for every 128-bit x, -2^127 included (its magnitude is read unsigned)."""
    q, r = divmod_small(abs_(x), count)
    up = (2 * r > count) | ((2 * r == count) & ((lo(q) & 1) == 1))
    q = add(q, from_int64(up.long()))[0]
    return torch.where(is_negative(x)[:, None], neg(q), q)


def _chunks(k: int) -> list[int]:
    """10^k as factors below 2^31 (10^9 each, then the rest)."""
    out = [10 ** 9] * (k // 9)
    if k % 9:
        out.append(10 ** (k % 9))
    return out


def scale_up(x: torch.Tensor, k: int) -> torch.Tensor:
    """``x * 10^k``; the caller checks the range first (``exceeds``) so the product stays in 128 bits."""
    if k <= 0:
        return x
    m = abs_(x)
    for c in _chunks(k):
        m = _mul_small(m, c)
    return torch.where(is_negative(x)[:, None], neg(m), m)


def div_pow10(x: torch.Tensor, k: int, rounding: str = "half_up") -> torch.Tensor:
    """``x / 10^k`` rounded half away from zero (DuckDB's decimal rescale), or toward zero
    (``rounding="trunc"``, an integer part)."""
    if k <= 0:
        return x
    m = abs_(x)
    for c in _chunks(k - 1):
        m = divmod_small(m, c)[0]
    q, last = divmod_small(m, 10)
    if rounding == "half_up":
        q = add(q, from_int64((last >= 5).long()))[0]
    return torch.where(is_negative(x)[:, None], neg(q), q)


# -- order ------------------------------------------------------------------------------------------
def order_pairs(x: torch.Tensor) -> torch.Tensor:
    """[n, 2] rows (high, low ^ sign) whose lexicographic signed order is the values' order."""
    return torch.stack([hi(x), lo(x) ^ SIGN], dim=1)


def compare(op: str, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    ha, hb = hi(a), hi(b)
    la, lb = lo(a) ^ SIGN, lo(b) ^ SIGN
    if op == "=":
        return (ha == hb) & (la == lb)
    if op == "<>":
        return (ha != hb) | (la != lb)
    if op in (">", ">="):
        ha, hb, la, lb, op = hb, ha, lb, la, "<" if op == ">" else "<="
    lt = (ha < hb) | ((ha == hb) & (la < lb))
    return lt if op == "<" else lt | ((ha == hb) & (la == lb))


def exceeds(x: torch.Tensor, bound: int) -> torch.Tensor:
    """True where |x| >= bound (0 < bound < 2^127), as ``compare(">=", abs_(x), bound)`` with the
    bound's words as Python scalars (no tensor of copies of it, no host-to-device copy)."""
    m = abs_(x)
    high, low = bound >> 64, _signed64(bound & (2 ** 64 - 1)) ^ SIGN
    mh, ml = hi(m), lo(m) ^ SIGN
    return ~((mh < high) | ((mh == high) & (ml < low)))


def order_key(x: torch.Tensor) -> torch.Tensor:
    """One int64 per row in the values' order, equal exactly where they are: the values themselves
    when all fit int64 (SUM results nearly always: one check, no sort), else their dense ranks
    (only comparable within this tensor)."""
    if len(x) == 0 or bool(fits_int64(x).all()):
        return lo(x)
    return dense_rank(x)[0]


def dense_rank(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(rank, uniques): int64 ranks in value order (equal values, equal ranks) and the distinct values."""
    if len(x) == 0:
        return torch.zeros(0, dtype=torch.int64, device=x.device), x
    u, inverse = torch.unique(order_pairs(x), dim=0, sorted=True, return_inverse=True)
    return inverse, torch.stack([u[:, 1] ^ SIGN, u[:, 0]], dim=1)


# -- floats -----------------------------------------------------------------------------------------
def to_float64(x: torch.Tensor) -> torch.Tensor:
    """The double nearest the value (as good as one rounding almost always): the magnitude's three
    exact parts (high word, upper and lower 32 bits of the low word) summed with the first sum's
    rounding error carried (no cancellation: all parts are non-negative)."""
    m = abs_(x)
    a = hi(m).double() * 2.0 ** 64  # the high word: rounded once (exact below 2^53)
    b = ((lo(m) >> 32) & MASK32).double() * 2.0 ** 32
    c = (lo(m) & MASK32).double()
    s = a + b
    err = b - (s - a)
    f = s + (err + c)
    return torch.where(is_negative(x), -f, f)


def to_float64_scaled(x: torch.Tensor, scale: int) -> torch.Tensor:
    """``x / 10^scale`` as a double: the integer part and the fraction converted apart, so a
    value's digits are not rounded twice in one big number."""
    if scale == 0:
        return to_float64(x)
    if 10 ** scale < 2 ** 31:  # one long division gives both parts: |x| = q * 10^s + r, r exact as a double
        q, r = divmod_small(abs_(x), 10 ** scale)
        f = to_float64(q) + r.double() / 10.0 ** scale
        return torch.where(is_negative(x), -f, f)
    whole = div_pow10(x, scale, "trunc")
    frac = sub(x, scale_up(whole, scale))[0]
    return to_float64(whole) + to_float64(frac) / 10.0 ** scale


def from_float64(f: torch.Tensor) -> torch.Tensor:
    """An integer-valued double (|f| < 2^127) as 128 bits, exactly."""
    m = f.abs()  # the magnitude's words are exact doubles: no 2^64 - small rounding up
    high = torch.floor(m / 2.0 ** 64)
    low = m - high * 2.0 ** 64  # in [0, 2^64)
    low = torch.where(low >= 2.0 ** 63, low - 2.0 ** 64, low)
    x = torch.stack([low.long(), high.long()], dim=1)
    return torch.where((f < 0)[:, None], neg(x), x)


# -- reductions -------------------------------------------------------------------------------------
def segment_sum(x: torch.Tensor, reduce_limb) -> tuple[torch.Tensor, torch.Tensor]:
    """(per-group sums, overflow of 128 bits): ``reduce_limb(t)`` sums an int64 row tensor per group
    (a segment reduction); each 32-bit limb column is summed on its own and the carries folded back."""
    return from_limbs32([reduce_limb(limb) for limb in limbs32(x)])

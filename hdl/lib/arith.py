"""Arithmetic that synthesis should build from adders, not from a multiplier block."""

from amaranth.hdl import Mux, Signal, Value, signed

__all__ = ["csd_digits", "times_constant", "shift_add_multiply"]


def csd_digits(k: int) -> list[tuple[int, int]]:
    """The canonical signed-digit form of *k* (>= 0): ``(shift, +1 or -1)`` pairs, least
    significant first, no two digits adjacent, so ``k = sum(sign << shift)`` with the fewest
    non-zero digits (14 = 16 - 2, 12 = 16 - 4)."""
    if not isinstance(k, int) or k < 0:
        raise ValueError(f"csd_digits needs an int >= 0, not {k!r}")
    digits, shift = [], 0
    while k:
        if k & 1:
            sign = 2 - (k & 3)          # k % 4 == 1 -> +1, == 3 -> -1
            digits.append((shift, sign))
            k -= sign
        k >>= 1
        shift += 1
    return digits


def times_constant(value, k: int) -> Value:
    """``value * k`` (unsigned *value*, constant *k* >= 0) as shifted copies added and
    subtracted (:func:`csd_digits`): yosys maps a ``*`` by a constant that is not a power of
    two to a DSP block (on the ECP5 a combinational MULT18X18D, slow into a register), where
    this is one carry chain per further digit."""
    value = Value.cast(value)
    if value.shape().signed:
        raise ValueError("times_constant takes an unsigned value")
    if k & (k - 1) == 0:
        # A power of two (or 0): the `*`, which yosys turns into wiring.
        return value * k
    digits = reversed(csd_digits(k))   # most significant first: that digit is +1
    total = value << next(digits)[0]
    for shift, sign in digits:
        total = total + (value << shift) if sign > 0 else total - (value << shift)
    return total


def shift_add_multiply(m, a, b):
    """Signed ``a * b`` as a sum of shifted partial products (two's complement: the sign bit
    of ``a`` weighs ``-2**(n-1)``), so that synthesis does not infer a DSP multiplier.

    The partial products are summed in a balanced tree of two-input adders, each sum a
    signal marked ``keep``: otherwise yosys merges the whole sum into one ``$macc`` cell and
    builds it from LUT full adders, several times larger, where each adder kept apart goes
    onto the carry chain, and the tree keeps the chains in series to its depth (4 adders for
    9 partial products)."""
    width = len(a)
    product_shape = signed(len(a) + len(b))
    terms = [Mux(a[i], b << i, 0) for i in range(width - 1)]
    terms.append(-Mux(a[width - 1], b << (width - 1), 0))
    level = 0
    while len(terms) > 1:
        pairs = []
        for i in range(0, len(terms) - 1, 2):
            total = Signal(product_shape, name=f"mul_sum_{level}_{i // 2}",
                           attrs={"keep": 1})
            m.d.comb += total.eq(terms[i] + terms[i + 1])
            pairs.append(total)
        if len(terms) % 2:
            pairs.append(terms[-1])         # the odd one out waits for the next level
        terms = pairs
        level += 1
    return terms[0]

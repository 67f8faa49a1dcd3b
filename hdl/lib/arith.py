"""Arithmetic that synthesis should build from adders, not from a multiplier block."""

from amaranth.hdl import Value

__all__ = ["csd_digits", "times_constant"]


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
    two to a DSP block (on the ECP5 a combinational MULT18X18D, 8-11 ns into a register on
    the ULX3S), where this is one carry chain per further digit."""
    value = Value.cast(value)
    if value.shape().signed:
        raise ValueError("times_constant takes an unsigned value")
    if k & (k - 1) == 0:
        # A power of two (or 0): the `*` yosys turns into wiring, so that these builds keep
        # the netlist they were measured on.
        return value * k
    digits = reversed(csd_digits(k))   # most significant first: that digit is +1
    total = value << next(digits)[0]
    for shift, sign in digits:
        total = total + (value << shift) if sign > 0 else total - (value << shift)
    return total

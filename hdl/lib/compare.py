"""Magnitude compares built as a tree of small functions instead of a carry chain."""

from amaranth.hdl import Cat, Value

__all__ = ["greater_than"]


def greater_than(a, b) -> Value:
    """``a > b`` for two values of one width and signedness, as a tree of two-bit compares.

    Synthesis maps ``>`` to a subtraction on the carry chain. On the ECP5 the chain of a
    narrow compare leaves through extra cells with routing between them, and its result
    must still be routed out of the chain's far end, which makes it slow even between two
    adjacent registers. Here each pair of bits gives "greater" and "equal" (one LUT each),
    and pairs of those combine into the pair above them, (g, e) = (g_hi |
    e_hi & g_lo, e_hi & e_lo): an 8-bit compare is three LUT levels.
    """
    a, b = Value.cast(a), Value.cast(b)
    if len(a) != len(b) or a.shape().signed != b.shape().signed:
        raise ValueError(f"greater_than needs two values of one shape, not {a.shape()} and "
                         f"{b.shape()}")
    width = len(a)
    if width == 0:
        raise ValueError("greater_than needs values of at least one bit")
    if a.shape().signed:
        # Offset binary: with the sign bits flipped the order is the unsigned one.
        a = Cat(a[:-1], ~a[-1])
        b = Cat(b[:-1], ~b[-1])
    # (greater, equal) of each group of two bits, least significant first.
    groups = []
    for low in range(0, width, 2):
        ga, gb = a[low:low + 2], b[low:low + 2]
        if len(ga) == 1:
            groups.append((ga & ~gb, ga == gb))
        else:
            above = (ga[1] & ~gb[1]) | ((ga[1] == gb[1]) & ga[0] & ~gb[0])
            groups.append((above, ga == gb))
    while len(groups) > 1:
        merged = []
        for index in range(0, len(groups) - 1, 2):
            (g_lo, e_lo), (g_hi, e_hi) = groups[index], groups[index + 1]
            merged.append((g_hi | (e_hi & g_lo), e_hi & e_lo))
        if len(groups) % 2:
            merged.append(groups[-1])
        groups = merged
    return groups[0][0]

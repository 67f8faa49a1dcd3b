"""Register chains: delay lines and register copies that split a fan-out."""

from amaranth.hdl import Cat, Module, Mux, Signal, Value

__all__ = ["delay_line", "register_copies"]


def delay_line(m: Module, value, depth: int, *, name: str, reset_less: bool = False):
    """``value`` delayed by ``depth`` registers in ``m.d.sync`` (``depth`` may be 0)."""
    for index in range(depth):
        reg = Signal.like(value, name=f"{name}_d{index}", reset_less=reset_less)
        m.d.sync += reg.eq(value)
        value = reg
    return value


def register_copies(m: Module, value, count: int, name: str) -> list[Signal]:
    """*count* registers, each a cycle behind *value*, for a signal whose fan-out would
    otherwise be routed across the part. Each copy's next value is written from its own
    value (the same function as ``copy.eq(value)``), so that synthesis does not merge them.
    *value* must never be undefined in simulation (not from a register without reset before
    it is written): a copy that once held ``x`` would keep it."""
    value = Value.cast(value)
    copies = []
    for index in range(count):
        copy = Signal(len(value), name=f"{name}_copy{index}")
        m.d.sync += copy.eq(Cat(*(Mux(copy[i] == value[i], copy[i], value[i])
                                  for i in range(len(value)))))
        copies.append(copy)
    return copies

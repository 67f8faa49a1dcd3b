"""Transports implementing :class:`firmware.runtime.Device`: ``isa`` (the ISA simulator in
process), ``rtl`` (the RTL core under cocotb) and ``serial`` (a board over its UART host link,
or the board model of :mod:`sim.models.link_model` through a ``socket://`` URL)."""

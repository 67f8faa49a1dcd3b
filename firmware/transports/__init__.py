"""Transports implementing :class:`firmware.runtime.Device`: ``isa`` (the ISA simulator in
process) and ``rtl`` (the RTL core under cocotb)."""

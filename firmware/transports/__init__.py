"""Transports implementing :class:`firmware.device.Device`, one a module, each registering
itself under its module's name (:func:`firmware.device.register_transport`) for
:func:`firmware.device.open_device`: ``isa`` (the ISA simulator in process), ``rtl`` (the RTL
core under cocotb) and ``serial`` (a board over its UART host link, or the board model of
:mod:`sim.models.link_model` through a ``socket://`` URL)."""

"""Gateware: the amtpu accelerator in Amaranth HDL."""

"""Reference models: the bit-exact numpy golden model, the ISA-level simulator and the
board side of the host link.
"""

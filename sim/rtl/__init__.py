"""RTL simulation plumbing: Verilog generation, the cocotb runner, stream drivers and
scoreboards, GTKWave save files, the RTL transport's simulation side, vendor primitives'
Verilog models.
"""

"""The datapath: processing elements, the systolic array and its weight FIFO, the
matrix unit, the accumulators and the activation units.
"""

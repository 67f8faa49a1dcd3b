"""On-chip memories: the row memory under the unified buffer and the weight memory,
block RAM with a registered read, and a FIFO on block RAM.
"""

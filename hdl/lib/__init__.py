"""Helpers several blocks use: constant multiplies, compares, register fan-out, vendor
primitives.
"""

"""Waveforms: the waveform tour and its screenshot (GTKWave save files: :mod:`sim.rtl.gtkw`).
"""

"""Waveforms: GTKWave save files, the waveform tour and its screenshot.
"""

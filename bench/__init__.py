"""Benchmarks that print figures (synthesis, utilisation, simulation speed); run each with
``python -m bench.<name>``. Never timed assertions: tests live in ``tests/``."""

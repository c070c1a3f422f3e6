"""Benchmark tests: every test here takes the ``kimi_layout`` parameter via ``speedbench``."""

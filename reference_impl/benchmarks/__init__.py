"""Benchmarks: scripts that print measurements side by side; none of them asserts a time."""

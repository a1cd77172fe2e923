"""Benchmarks: commands that print numbers (tests assert behaviour, never timings)."""

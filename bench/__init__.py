"""Benchmarks: measured, never assumed; each reports ratios measured in the same run."""

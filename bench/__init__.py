"""Benchmarks behind ``snet bench``: every figure is a ratio measured in the same run.

Like the command line, this harness starts servers and workers, so it may import both
``snet.server`` and ``snet.client``.
"""

"""An emulated ICSI Spert-II board (T0 vector unit, 16-bit fixed point with 32-bit
saturating accumulators, 8 MB of memory, an SBus link) that trains as a snet worker.

``fixedpoint`` holds the words and primitives (and the table of formats), ``kernels`` the
network arithmetic, ``timing`` the cost model and clock, ``board`` the device and its
calls, ``backend`` the host side that is a ``ComputeBackend`` named "spert".
"""

"""The performance model: what a run of snet should cost, before it runs.

``model`` holds the models of the seed papers (Quicknet on MultiSpert; the BSP cost of
exemplar parallelism) and the constants they are calibrated with, ``plan`` their
predictions as tables and a JSON document, ``figure`` the model drawn against a
measurement (matplotlib, optional). It depends on ``snet.protocol`` alone: ``snet plan``
(cli/), the modelled worker backend (client/) and the benchmarks in a checkout's bench/
all import it, and it imports none of them.
"""

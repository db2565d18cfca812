"""Stage 7, run: what a run needs around the plan it executes.

:mod:`.feeds` (the inputs' descriptions and the feed checks), :mod:`.limits` (the
allocation cap kernels consult), :mod:`.threads` (BLAS and kernel thread counts),
:mod:`.profiling` (Chrome-trace events) and :mod:`.malloc` (the C heap's tuning).
"""

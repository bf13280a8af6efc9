"""Attention ops: one contract (`reference.attention`), several implementations.

`dispatch.attention` is the entry point: `reference` (einsums), `blockwise` (pure-JAX
tiles, recomputing custom VJP), `pallas` (fused Triton kernels, forward and backward), and
`auto`. `benchmark` measures them (experiments/benchmark_attention.py) and `parity` checks
each against the float64 reference (the first stage of launch/gpu_window.py).
"""

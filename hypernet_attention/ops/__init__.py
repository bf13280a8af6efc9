"""Attention ops: one contract (`reference.attention`), several implementations.

`dispatch.attention` is the entry point: `reference` (einsums), `factored`, `blockwise` (pure-JAX
tiles, recomputing custom VJP), `mosaic` (HYLA fused for Hopper in Pallas Mosaic GPU, forward and
backward), and `auto`. `measure/benchmark.py` times them (experiments/benchmark_attention.py) and
`measure/parity.py` checks each against the float64 reference (launch/gpu_window.py)."""

"""Attention as a Hypernetwork (Schug et al., ICLR 2025) in JAX/Flax."""

"""Latent-code probing: restore a run, read its codes, decode, compare, draw, report."""

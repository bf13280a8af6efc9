"""The run layer, without JAX: what a run is on disk and how it is started and checked.

`launch/` imports only this package (and `errors`); nothing here imports jax, flax, optax or
orbax (tests/launch/test_launch_without_jax.py), so a laptop without JAX can check a config,
plan a sweep and read its results. The training code (`train/`) builds on it."""

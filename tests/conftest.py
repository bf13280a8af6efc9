"""Shared fixtures for the model tests."""

import jax
import pytest


@pytest.fixture
def x64():
  """Runs the test with 64-bit floats enabled (sharper equivalence checks), then resets."""
  previous = jax.config.jax_enable_x64
  jax.config.update("jax_enable_x64", True)
  try:
    yield
  finally:
    jax.config.update("jax_enable_x64", previous)


def pytest_configure(config):
  config.addinivalue_line(
      "markers", "gpu: needs a CUDA GPU (compiles the Pallas kernels with Triton); skipped "
      "cleanly elsewhere")

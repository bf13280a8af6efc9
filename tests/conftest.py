"""Shared fixtures for the model tests."""

import os

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
  # Markers are registered in pytest.ini.
  # On Python 3.13, TensorFlow's autograph (the C4 input pipeline) builds AST nodes through
  # gast with keyword arguments Python 3.15 will refuse: thousands of warnings per run, in
  # TensorFlow's dependency, not in this code; to be gone with a gast release that follows.
  config.addinivalue_line(
      "filterwarnings", "ignore::DeprecationWarning:gast.astn")


def pytest_collection_modifyitems(config, items):
  """`TESTS_REVERSED=1` runs the suite in reverse order: no test may depend on another
  having run first (or on which process compiled first)."""
  del config
  if os.environ.get("TESTS_REVERSED") == "1":
    items.reverse()

"""README.md's "Use HYLA in your own model" snippets run exactly as written.

Each Python block of that section is executed as it stands in the README, in a fresh
namespace, and what it promises (output shape, the sown latent code) is then checked.
"""

import os
import re

import jax.numpy as jnp

README = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "README.md"))
SECTION = "## Use HYLA in your own model"


def snippets() -> list[str]:
  text = open(README).read()
  assert SECTION in text, f"README.md lost its section {SECTION!r}"
  section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
  return re.findall(r"```python\n(.*?)```", section, re.S)


def test_section_has_a_linen_and_an_nnx_snippet_of_about_ten_lines():
  blocks = snippets()
  assert len(blocks) == 2
  assert "flax.linen" in blocks[0] and "from flax import nnx" in blocks[1]
  assert all(len(b.strip().splitlines()) <= 16 for b in blocks)


def test_linen_snippet_runs():
  namespace = {}
  exec(compile(snippets()[0], "README.md (Linen)", "exec"), namespace)
  assert namespace["y"].shape == (2, 10, 32)
  (code,) = namespace["state"]["intermediates"]["MultiHeadAttention_0"]["latent_code"]
  assert code.shape == (2, 4, 10, 10)


def test_nnx_snippet_runs():
  namespace = {}
  exec(compile(snippets()[1], "README.md (NNX)", "exec"), namespace)
  assert namespace["y"].shape == (2, 10, 32)
  assert namespace["latent_code"].shape == (2, 4, 10, 10)
  # load_params copied the standard weights: same numbers as Flax's module under softmax.
  hyla, standard = namespace["hyla"], namespace["standard"]
  assert jnp.array_equal(hyla.query.kernel[...], standard.query.kernel[...])

"""README.md is a first hour: short, two commands first, links that lead somewhere, and
"Use HYLA in your own model" snippets that run exactly as written.

Each Python block of that section is executed as it stands in the README, in a fresh
namespace, and what it promises (output shape, the sown latent code) is then checked. The
details the README leaves out live in the documents it links (experiments/reference.md,
experiments/campaign.md, experiments/results/README.md), whose links are checked too.
"""

import os
import re

import jax.numpy as jnp
import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
README = os.path.join(REPO, "README.md")
SECTION = "## Use HYLA in your own model"
MAX_LINES = 300
# The documents a newcomer reaches from the README; their relative links must resolve too.
DOCUMENTS = ("README.md", "experiments/reference.md", "experiments/campaign.md",
             "experiments/results/README.md")
# The README's two commands: a fresh venv, an install, then the main job / the test suite.
COMMANDS = (
    "python3 -m venv .venv && . .venv/bin/activate && pip install -q -e . && "
    "python experiments/sraven_scaling.py",
    "python3 -m venv .venv && . .venv/bin/activate && pip install -q -e '.[dev]' && "
    "python -m pytest -q -n 2 tests",
)


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


def test_readme_is_at_most_300_lines():
  lines = open(README).read().splitlines()
  assert len(lines) <= MAX_LINES, (
      f"README.md has {len(lines)} lines, at most {MAX_LINES}: move details to experiments/")


def test_two_commands_come_first_each_with_its_measured_time():
  text = open(README).read()
  first_block = re.search(r"```(\w*)\n(.*?)```", text, re.S)
  assert first_block and first_block.group(1) == "bash", "README.md must open with a bash block"
  assert not re.search(r"^## ", text[:first_block.start()], re.M), "the commands come first"
  lines = first_block.group(2).strip().splitlines()
  comments = [line for line in lines if line.startswith("#")]
  commands = [line for line in lines if not line.startswith("#")]
  assert tuple(commands) == COMMANDS
  # Each command is announced by its comment, which says where its time was measured.
  assert len(comments) == 2 and all("measured on" in c for c in comments), comments
  # CI runs the test command verbatim (.ci/run), so command 2 is what CI proves.
  assert COMMANDS[1] in open(os.path.join(REPO, ".ci", "run")).read()


def _anchors(path: str) -> set[str]:
  """GitHub's anchors of a Markdown file's headings: lower case, punctuation dropped,
  spaces to hyphens."""
  headings = re.findall(r"^#+ (.+)$", open(path).read(), re.M)
  return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


@pytest.mark.parametrize("document", DOCUMENTS)
def test_every_relative_link_resolves(document):
  path = os.path.join(REPO, document)
  text = re.sub(r"```.*?```", "", open(path).read(), flags=re.S)  # Code is not links.
  broken = []
  for target in re.findall(r"\]\(([^)\s]+)\)", text):
    if re.match(r"[a-z]+:", target):
      continue  # http(s):, mailto:
    file, _, anchor = target.partition("#")
    resolved = os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path
    if not os.path.exists(resolved):
      broken.append(f"{target} (no such file)")
    elif anchor and resolved.endswith(".md") and anchor not in _anchors(resolved):
      broken.append(f"{target} (no such heading)")
  assert not broken, f"{document}: broken links {broken}"

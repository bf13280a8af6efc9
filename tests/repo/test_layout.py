"""The README's Layout names every package, and the contributor's map every module.

A module added under `hypernet_attention/` or `launch/` without a word in the contributor's
map (experiments/reference.md, "Where the code lives"), or a package missing from the
README's Layout block, fails here; the sweeps of `launch/sweeps/` are listed by `SWEEPS`.
"""

import os
import re

import train_testlib as tl


def _section(path: str, title: str) -> str:
  text = open(os.path.join(tl.REPO, path)).read()
  start = text.index(title)
  end = text.find("\n## ", start + len(title))
  return text[start:end if end > 0 else None]


def _modules():
  """(package folder, module name) for every module of hypernet_attention/ and launch/."""
  for top in ("hypernet_attention", "launch"):
    for root, dirs, names in os.walk(os.path.join(tl.REPO, top)):
      dirs[:] = [d for d in dirs if d != "__pycache__"]
      rel = os.path.relpath(root, tl.REPO)
      for name in names:
        if name.endswith(".py") and name != "__init__.py" and rel != "launch/sweeps":
          yield rel, name[:-3]


def test_contributors_map_names_every_module():
  text = _section("experiments/reference.md", "**Where the code lives**")
  missing = [f"{rel}/{name}.py" for rel, name in _modules()
             if not re.search(rf"`{re.escape(name)}`", text)]
  assert not missing, f"add to experiments/reference.md's 'Where the code lives': {missing}"


def test_readme_layout_names_every_package():
  text = _section("README.md", "## Layout")
  packages = sorted({rel for rel, _ in _modules()} | {"launch/sweeps"})
  missing = [p for p in packages if not re.search(
      rf"(^|\s){re.escape(p.split('/')[-1])}/", text, re.M)]
  assert not missing, f"add to the README's Layout: {missing}"

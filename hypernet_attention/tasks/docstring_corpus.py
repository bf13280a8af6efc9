"""A few MB of real English text without a download: docstrings of installed packages.

The laptop-sized language-modeling run (`experiments/configs/c4_lm.py:size=local`) needs
real prose that every installation has. The docstrings of the scientific Python packages
this project depends on (numpy, scipy, jax, ...) are exactly that: written English with
code and math mixed in, much like C4's technical pages. Each docstring of a module, class
or function (at least `min_chars` long, duplicates removed) is one document; every
`validation_every`-th document goes to the validation file. The order is the sorted file
order, so the corpus is the same on every machine with the same package versions."""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import os
import pathlib
from typing import Iterator, Sequence

PACKAGES = ("numpy", "scipy", "jax", "flax", "optax", "sklearn", "matplotlib",
            "tensorflow_datasets")
_DOC_NODES = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def docstrings(packages: Sequence[str] = PACKAGES, min_chars: int = 200) -> Iterator[str]:
  """Unique docstrings of the installed `packages`, in sorted file order (tests skipped)."""
  seen = set()
  for name in packages:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
      continue
    root = pathlib.Path(list(spec.submodule_search_locations)[0])
    for path in sorted(root.rglob("*.py")):
      if "tests" in path.relative_to(root).parts:
        continue
      try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
      except (SyntaxError, UnicodeDecodeError, ValueError):
        continue
      for node in ast.walk(tree):
        if not isinstance(node, _DOC_NODES):
          continue
        text = ast.get_docstring(node)
        if not text or len(text) < min_chars:
          continue
        digest = hashlib.sha1(text.encode("utf-8")).digest()
        if digest not in seen:
          seen.add(digest)
          yield text


def write(out_dir: str, megabytes: float, validation_every: int = 20) -> tuple[str, str]:
  """Writes `train.jsonl` / `validation.jsonl` ({"text": ...} per line) of about
  `megabytes` MB to `out_dir` (kept if already there); returns their paths."""
  os.makedirs(out_dir, exist_ok=True)
  train, validation = (os.path.join(out_dir, f"{s}.jsonl") for s in ("train", "validation"))
  if os.path.exists(train) and os.path.exists(validation):
    return train, validation
  budget, written = int(megabytes * 2**20), 0
  with open(train + ".tmp", "w") as f_train, open(validation + ".tmp", "w") as f_val:
    for i, text in enumerate(docstrings()):
      line = json.dumps({"text": text}) + "\n"
      (f_val if i % validation_every == validation_every - 1 else f_train).write(line)
      written += len(line)
      if written >= budget:
        break
  if written == 0:
    raise ValueError(f"no docstrings found in the installed packages {PACKAGES}; "
                     "allowed: a Python environment with at least one of them.")
  # Renamed last, so an interrupted write is redone instead of leaving a short corpus.
  os.replace(validation + ".tmp", validation)
  os.replace(train + ".tmp", train)
  return train, validation

"""The README's Layout names every package, and the contributor's map every module.

A module added under `hypernet_attention/` or `launch/` without a word in the contributor's
map (experiments/reference.md, "Where the code lives"), or a package missing from the
README's Layout block, fails here. Two kinds are listed elsewhere: the sweeps of
`launch/sweeps/` by `SWEEPS`, and a task's module by its registry record (`Experiment.task`),
so that a new task is its module, its config and its record, with no line of the map.
"""

import os
import re

from hypernet_attention.runs import registry

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


def _unmapped(modules) -> list[str]:
  """The modules of `modules` that the map does not name and no registry record names."""
  text = _section("experiments/reference.md", "**Where the code lives**")
  recorded = {e.task.partition(":")[0] for e in registry.EXPERIMENTS.values()
              if isinstance(e.task, str)}
  return [f"{rel}/{name}.py" for rel, name in modules
          if not re.search(rf"`{re.escape(name)}`", text)
          and f"{rel}/{name}".replace("/", ".") not in recorded]


def test_contributors_map_names_every_module():
  missing = _unmapped(_modules())
  assert not missing, f"add to experiments/reference.md's 'Where the code lives': {missing}"


def test_a_new_task_module_is_found_through_its_record(monkeypatch):
  """The map's recipe for a new task (three files) holds here: its module, named by its
  record, needs no line in the map; a helper module beside it does."""
  new = [("hypernet_attention/tasks", "toy_count"), ("hypernet_attention/tasks", "toy_util")]
  assert _unmapped(new) == ["hypernet_attention/tasks/toy_count.py",
                            "hypernet_attention/tasks/toy_util.py"]
  monkeypatch.setitem(registry.EXPERIMENTS, "toy_count", registry.Experiment(
      "toy_count", "experiments/configs/toy_count.py", "loss",
      task="hypernet_attention.tasks.toy_count:ToyCount"))
  assert _unmapped(new) == ["hypernet_attention/tasks/toy_util.py"]


def test_readme_layout_names_every_package():
  text = _section("README.md", "## Layout")
  packages = sorted({rel for rel, _ in _modules()} | {"launch/sweeps"})
  missing = [p for p in packages if not re.search(
      rf"(^|\s){re.escape(p.split('/')[-1])}/", text, re.M)]
  assert not missing, f"add to the README's Layout: {missing}"

"""The paper's sweeps as lists of config overrides, one module per figure or table.

Each module defines `EXPERIMENT` (the script under `experiments/`) and `get_sweep()`, a list
of points. A point is a dict: the key `config` is the argument of the experiment's config file
(`experiments/configs/<name>.py:<config>`), every other key is a `--config.<key>=<value>`
override. One point is one job.
"""

import importlib

SWEEPS = (
    "table_a1_sraven",
    "table_a1_fuzzy",
    "fig2c_fuzzy",
    "fig4_sraven_scaling",
    "activations_sraven",
)


def load(name: str):
  """Returns the sweep module `name`, with a clear error for unknown names."""
  if name not in SWEEPS:
    raise ValueError(f"Unknown sweep {name!r}; allowed: {', '.join(SWEEPS)}.")
  return importlib.import_module(f"launch.sweeps.{name}")

"""The paper's sweeps as lists of config overrides, one module per figure or table.

Each module defines `EXPERIMENT` (a name of `hypernet_attention.runs.registry`) and `get_sweep()`, a
list of points, and states its job count in its docstring. A point is a dict: the key `config` is
the argument of the experiment's config file (`experiments/configs/<name>.py:<config>`), every other
key is a `--config.<key>=<value>` override. One point is one job. Run them with `launch.xm_launch`
(XManager) or `launch.run_local` (this machine); tabulate them with `launch.collect`."""

import importlib
import os

from hypernet_attention import errors

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SWEEPS = ("table_a1_sraven", "table_a1_fuzzy", "table_a1_fuzzy_local", "table_a1_sraven_local",
          "fig2c_fuzzy", "fig4_sraven_scaling", "fig5c_heads_sraven", "figa5_holdout_sraven",
          "activations_sraven", "smoke_fuzzy", "smoke_population_fuzzy", "c4_lm")


def load(name: str):
  """Returns the sweep module `name`, with a clear error for unknown names."""
  errors.check_choice("sweep", name, SWEEPS)
  return importlib.import_module(f"launch.sweeps.{name}")

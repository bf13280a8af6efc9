"""Subprocess side of tests/e2e/test_population_mesh.py (fake CPU devices must be set before jax).

  python tests/e2e/population_helper.py OUT_DIR
      4 fake devices: a 4-member population trained on 1 device, with its members spread
      over 4 devices (mesh member=4), and over 2 x 2 (member=2, data=2). Writes
      OUT_DIR/result.json: per-mesh losses and max relative parameter differences against
      1 device, and the collectives in the member=4 train chunk's compiled HLO.
"""

import json
import os
import re
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))

# pylint: disable=g-import-not-at-top,wrong-import-position
import jax

# jax's own options, before anything initializes a backend.
jax.config.update("jax_platforms", "cpu")
jax.config.update("jax_num_cpu_devices", 4)
import numpy as np

from experiments.configs import sraven
from hypernet_attention.runs import config_checks
from hypernet_attention.train import population

# pylint: enable=g-import-not-at-top,wrong-import-position

NUM_STEPS = 8
MESHES = {"one": dict(member=1, data=1), "member4": dict(member=4, data=1),
          "member2_data2": dict(member=2, data=2)}


def _config(mesh):
  config = sraven.get_config("model=hyla,size=smoke")
  config.eval.ceiling_problems = 0
  config.mesh.update(mesh)
  config.population.members = tuple(
      {"seed": s, "optimizer.learning_rate": lr} for s, lr in
      ((0, 1e-3), (1, 1e-3), (2, 3e-3), (3, 3e-3)))
  return config


def main(out_dir):
  result, params = {}, {}
  for name, mesh in MESHES.items():
    devices = jax.devices()[:1] if name == "one" else jax.devices()
    p = population.setup(config_checks.validate(_config(mesh)), devices)
    trainer = population.PopulationTrainer(p)
    state = trainer.init_state()
    if name == "member4":
      with jax.set_mesh(trainer.mesh):
        hlo = trainer._chunk_jit.lower(state, trainer.members, NUM_STEPS).compile().as_text()  # pylint: disable=protected-access
      result["member4_collectives"] = sorted(set(re.findall(
          r"\b(all-reduce|all-gather|all-to-all|collective-permute|reduce-scatter)\b", hlo)))
      result["member4_param_spec"] = str(jax.tree.leaves(state.params)[0].sharding.spec)
    state, metrics = trainer.train_chunk(state, NUM_STEPS)
    result[name] = np.asarray(metrics.per_step["loss"]).tolist()
    params[name] = [np.asarray(x) for x in jax.tree.leaves(state.params)]
  for name in MESHES:
    result[f"{name}_params_rel"] = max(
        float(np.abs(a - b).max() / np.abs(b).max()) for a, b in zip(params[name], params["one"]))
  with open(os.path.join(out_dir, "result.json"), "w") as f:
    json.dump(result, f)


if __name__ == "__main__":
  main(sys.argv[1])

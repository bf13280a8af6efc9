"""A run built from its config, without the loop: what `build.setup` derives, what
`init_state` materializes, and which configs it refuses (as `errors.BadInput`, before work)."""

import flax.linen as nn
import jax
import numpy as np
import optax
import pytest

from hypernet_attention import errors
from hypernet_attention.runs import config_checks
from hypernet_attention.train import build
from hypernet_attention.train import objectives
from hypernet_attention.train import state as state_lib

import train_testlib as tl


@pytest.fixture(scope="module")
def sraven():
  config = tl.smoke("sraven", "hyla", **{"eval.ceiling_problems": 0})
  return config, build.setup(config_checks.validate(config))


def test_setup_joins_the_config_and_the_task_and_materializes_nothing(sraven):
  config, s = sraven
  task = s.objective.task
  model = s.model.config
  # The config's model fields, and the ones the task fixes.
  assert (model.attention, model.num_layers, model.emb_dim) == ("hyla", 2, 32)
  assert (model.input_kind, model.output_dim) == ("dense", task.num_values)
  assert model.num_buckets == model.max_distance == task.grid_size ** 2 * task.num_features
  leaves = jax.tree.leaves(nn.meta.unbox(s.abstract_state))
  assert leaves and all(isinstance(x, jax.ShapeDtypeStruct) for x in leaves)
  # One sharding per leaf of the unboxed state, all on the run's mesh; restore targets carry them.
  assert jax.tree.structure(s.shardings) == jax.tree.structure(nn.meta.unbox(s.abstract_state))
  assert all(x.mesh == s.mesh for x in jax.tree.leaves(s.shardings))
  target = s.restore_target()
  assert all(x.sharding is not None for x in jax.tree.leaves(target))
  assert jax.tree.map(lambda x: x.shape, target) == jax.tree.map(lambda x: x.shape,
                                                                 nn.meta.unbox(s.abstract_state))


def test_init_state_is_the_abstract_state_drawn_from_the_seed(sraven):
  config, s = sraven
  state = build.init_state(config, s.init_fn, s.shardings)
  assert jax.tree.map(lambda x: (x.shape, x.dtype), state) == jax.tree.map(
      lambda x: (x.shape, x.dtype), nn.meta.unbox(s.abstract_state))
  assert int(state.step) == 0
  assert state_lib.count_params(state.params) == state_lib.count_params(s.abstract_state.params)
  again = build.init_state(config, s.init_fn, s.shardings)
  jax.tree.map(np.testing.assert_array_equal, state.params, again.params)
  other = build.init_state(tl.smoke("sraven", "hyla", seed=1), s.init_fn, s.shardings)
  assert not np.array_equal(np.asarray(state.params["input_dense"]["kernel"]),
                            np.asarray(other.params["input_dense"]["kernel"]))
  for moment in ("mu", "nu"):  # Adam's moments start at 0.
    leaves = jax.tree.leaves(optax.tree_utils.tree_get(state.opt_state, moment))
    assert leaves and not any(np.any(np.asarray(m)) for m in leaves)


def test_a_language_model_on_host_batches_embeds_its_vocabulary():
  config = tl.smoke("c4_lm", **{"task.name": objectives.SYNTHETIC_LM})
  s = build.setup(config_checks.validate(config))
  assert not s.objective.source.on_device
  model = s.model.config
  assert (model.input_kind, model.vocab_size, model.output_dim) == (
      "embed", config.task.vocab_size, config.task.vocab_size)


@pytest.mark.parametrize("updates, message", [
    ({"eval.splits": ("test", "nope")}, "nope"),
    ({"mesh.data": 2}, "does not divide the 1 devices"),
])
def test_unusable_configs_are_bad_input_before_any_work(updates, message):
  with pytest.raises(errors.BadInput, match=message) as error:
    build.setup(config_checks.validate(tl.smoke("sraven", **updates)))
  assert "\n" not in str(error.value)


_TWO_DEVICES = r"""
import json, sys
sys.path[:0] = sys.argv[1:2]  # The shared helpers.
import train_testlib as tl
from hypernet_attention import errors
from hypernet_attention.runs import config_checks
from hypernet_attention.train import build, population
out = {}
for members in (0, 1, 3):  # 0: a single run.
  config = tl.smoke("sraven", **{"mesh.member": 2, "eval.ceiling_problems": 0})
  if members:
    config.population.members = tuple({"seed": i} for i in range(members))
  try:
    (population.setup if members else build.setup)(config_checks.validate(config))
  except errors.BadInput as e:
    out[members] = str(e)
print(json.dumps(out))
"""


def test_a_member_mesh_axis_is_refused_for_a_run_and_sized_for_a_population():
  """With 2 fake CPU devices (set before jax starts, so in a subprocess), `mesh.member=2`: a
  single run is told it needs mesh.member=1; a population, even of one member, is told its
  size does not divide the member devices (it is a population, not a single run)."""
  out = tl.run_on_cpu_devices(_TWO_DEVICES, 2, tl.TESTS)
  assert out["0"] == ("config.mesh.member=2 spreads population members over devices; a single "
                      "run needs mesh.member=1"), out
  for members in ("1", "3"):
    assert out[members].startswith(f"{members} population members cannot be split over the "
                                   "mesh's 2 member devices"), out

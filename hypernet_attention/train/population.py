"""Populations: P runs that differ only in batchable settings, trained as one vmapped program.

The models of this paper are tiny (52k-400k parameters, batch 128), so one run uses 1-2% of an
accelerator. A population stacks P members' train states along a leading member axis and maps the
single run's own train step and evaluation (`trainer.Trainer`) over it: one jitted, scanned chunk
trains every member. What members may differ in (`run_files.MEMBER_KEYS`) is what can be data
instead of code: the seed (initialization, data order, dropout), the held-out split's seed (each
member's split tables are arrays, `task.sample(..., tables=)`), the peak learning rate, the weight
decay and the warmup (traced hyperparameters, `state.make_optimizer(config, member)`). Anything
else would change shapes or code and is refused in one line naming the key.

Member i computes exactly what the single run with its settings computes: the same step
function, the same keys, an optimizer state of the same tree. A member whose loss or
gradient turns NaN/Inf keeps its last finite state (its updates are masked out) while the
others go on; `population_loop.PopulationRun` reports it in that member's summary.

The member axis is the mesh's `member` axis (`sharding.py`): members are spread over
devices with no communication between them; the `data`/`fsdp` axes split each member's
batch and width as in a single run.

By hand (a sweep's launchers build these flags themselves, `launch/grouping.py`):

  python experiments/sraven_scaling.py --config=experiments/configs/sraven.py:model=hyla \
      --workdir=W "--config.population.members=({'seed': 0}, {'seed': 1, \
      'optimizer.learning_rate': 3e-4})" [--config.mesh.member=2 --config.mesh.data=1]

Shape letters: P members."""

from __future__ import annotations

import copy
import dataclasses
import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import ml_collections

from hypernet_attention import errors
from hypernet_attention.runs import config_checks
from hypernet_attention.train import build
from hypernet_attention.train import checkpointing
from hypernet_attention.train import metrics as metrics_lib
from hypernet_attention.train import objectives
from hypernet_attention.train import sharding
from hypernet_attention.train import state as state_lib
from hypernet_attention.train import trainer as trainer_lib

MEMBER_AXIS = "member"


@dataclasses.dataclass(frozen=True)
class PopulationSetup:
  """A population built from its config before any work: validated, nothing materialized."""
  single: build.Setup  # Member 0's run: model, objective, mesh, one member's shardings.
  member_configs: tuple[ml_collections.ConfigDict, ...]
  member_names: tuple[str, ...]  # Each member's directory in the population's workdir.
  member_objectives: tuple[objectives.Objective, ...]  # Each member's task (split tables).
  abstract_state: Any  # Unboxed TrainState of ShapeDtypeStructs with a leading (P,) axis.
  shardings: Any  # NamedSharding per leaf: member axis over the mesh's `member` axis.

  @property
  def size(self) -> int:
    return len(self.member_configs)

  def restore_target(self) -> Any:
    return checkpointing.abstract_with_shardings(self.abstract_state, self.shardings)


def stack_sharding(member_sharding: NamedSharding) -> NamedSharding:
  """A member leaf's sharding with the leading member axis split over `member`."""
  axis = MEMBER_AXIS if MEMBER_AXIS in member_sharding.mesh.axis_names else None
  return NamedSharding(member_sharding.mesh, P(axis, *member_sharding.spec))


def setup(checked: config_checks.Checked, devices=None) -> PopulationSetup:
  """Builds the population abstractly from its checked config (`config_checks.validate`:
  each member validated as the run it is), checking what needs devices and tasks (mesh,
  split tables). Any problem is `BadInput`."""
  single = build.setup(config_checks.Checked(checked.members[0], checked.experiment), devices,
                       len(checked.members))
  member_objectives = [single.objective]
  for i, member in enumerate(checked.members[1:], 1):
    try:
      member_objectives.append(objectives.build(member, checked.experiment, members=0))
    except ValueError as e:
      raise errors.BadInput(f"config.population.members[{i}]: {e}") from e
  shapes = [jax.tree.map(jnp.shape, o.task.split_tables()) for o in member_objectives]
  if any(s != shapes[0] for s in shapes):
    raise errors.BadInput("population members' held-out splits differ in shape; "
                              "members may differ only in the split's seed")
  size = len(checked.members)
  mesh_members = single.mesh.shape.get(MEMBER_AXIS, 1)
  if size % mesh_members:
    raise errors.BadInput(
        f"{size} population members cannot be split over the mesh's {mesh_members} member "
        f"devices (mesh {dict(single.mesh.shape)}); use a member count that divides")
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct((size, *x.shape), x.dtype),
                          nn.meta.unbox(single.abstract_state))
  shardings = jax.tree.map(stack_sharding, single.shardings)
  return PopulationSetup(single, checked.members, checked.member_names, tuple(member_objectives),
                         abstract, shardings)


def member_arrays(p: PopulationSetup) -> dict[str, Any]:
  """Everything that differs between members, as arrays with a leading (P,) axis: the
  run keys, the split tables and the optimizer's hyperparameters."""
  opts = [c.optimizer for c in p.member_configs]
  tables = [o.task.split_tables() for o in p.member_objectives]
  return {
      "rng": jnp.stack([jax.random.key_data(jax.random.key(c.seed))
                        for c in p.member_configs]),
      "tables": jax.tree.map(lambda *t: jnp.stack(t), *tables),
      "learning_rate": jnp.asarray([o.learning_rate for o in opts], jnp.float32),
      "weight_decay": jnp.asarray([o.weight_decay for o in opts], jnp.float32),
      "warmup_steps": jnp.asarray([o.warmup_steps for o in opts], jnp.int32)}


@dataclasses.dataclass(frozen=True)
class _MemberSource:
  """An on-device source that samples with one member's split tables."""
  task: Any
  tables: Any
  on_device = True

  def sample(self, key, batch_size: int, split: str):
    return self.task.sample(key, batch_size, split, self.tables)


class PopulationTrainer:
  """The single run's jitted train chunk and evaluation, mapped over the member axis."""

  def __init__(self, p: PopulationSetup):
    s = p.single
    self.setup = p
    self.config = p.member_configs[0]
    self.mesh = s.mesh
    self.trainer = trainer_lib.Trainer(self.config, s)
    self._member_arrays = member_arrays(p)
    self._member_sharding = stack_sharding(sharding.replicated(self.mesh))
    self.spmd_axis = MEMBER_AXIS if MEMBER_AXIS in self.mesh.axis_names else None

  def _member(self, arrays):
    """The single run's Trainer with this member's keys, tables and optimizer (traced)."""
    view = copy.copy(self.trainer)
    view.rng = jax.random.wrap_key_data(arrays["rng"])
    view.tx = state_lib.make_optimizer(self.config, arrays)
    view.source = _MemberSource(self.trainer.source.task, arrays["tables"])
    return view

  def _member_step(self, arrays, state):
    new, (per_step, collection) = self._member(arrays).train_step(state)
    # A non-finite step is not applied: the member keeps its last finite state (frozen),
    # and its metrics are not merged into the window's averages.
    finite = jnp.isfinite(per_step["loss"]) & jnp.isfinite(per_step["grad_norm"])
    return (jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, state),
            (per_step, metrics_lib.keep_if(finite, collection)))

  def _vmap(self, fn):
    return jax.vmap(fn, spmd_axis_name=self.spmd_axis)

  @functools.cached_property
  def _chunk_jit(self):
    def chunk(state, members, length):
      step = lambda st, _: self._vmap(self._member_step)(members, st)
      state, (per_step, collections) = jax.lax.scan(step, state, None, length=length)
      return state, metrics_lib.ChunkMetrics(  # per_step {name: (P, length)}
          jax.tree.map(lambda m: m.T, per_step), collections.reduce())
    return jax.jit(
        chunk, static_argnums=2, donate_argnums=0, in_shardings=(self.setup.shardings, None),
        # Metrics stay on their member's devices: the chunk has no collective at all.
        out_shardings=(self.setup.shardings, stack_sharding(sharding.replicated(self.mesh))))

  def train_chunk(self, state, length: int):
    """`length` steps of every member; returns the state and their `metrics.ChunkMetrics`
    (per-step values (P, length), a collection per member)."""
    with jax.set_mesh(self.mesh):
      return self._chunk_jit(state, self.members, length)

  @functools.cached_property
  def members(self):
    """The members' keys on the devices, put there on first use: compiling needs only
    their shapes (`compile_chunk`), so a compile-only device never receives them."""
    return jax.device_put(self._member_arrays, self._member_sharding)

  def compile_chunk(self, state, length: int) -> jax.stages.Compiled:
    """`Trainer.compile_chunk` for every member at once."""
    with jax.set_mesh(self.mesh):
      members = jax.tree.map(lambda x: jax.ShapeDtypeStruct(
          x.shape, x.dtype, sharding=self._member_sharding), self._member_arrays)
      return self._chunk_jit.lower(state, members, length).compile()

  def init_state(self):
    """Every member's fresh state, as `build.init_state` makes the single run's."""
    init_fn = self.setup.single.init_fn

    def init(arrays):
      key = jax.random.wrap_key_data(arrays["rng"])
      return nn.meta.unbox(init_fn(jax.random.fold_in(key, 0)))
    init_jit = jax.jit(self._vmap(init), out_shardings=self.setup.shardings)
    with jax.set_mesh(self.mesh):
      return init_jit(self.members)

  @functools.cached_property
  def _eval_jit(self):
    splits = self.trainer.eval_splits

    def evaluate(arrays, params):
      view = self._member(arrays)
      return {split: view.eval_split(params, i, split) for i, split in enumerate(splits)}
    return jax.jit(self._vmap(evaluate), in_shardings=(None, self.setup.shardings.params),
                   out_shardings=sharding.replicated(self.mesh))

  def evaluate(self, params) -> list[dict[str, float]]:
    """Each member's eval metrics, as `trainer.Trainer.evaluate` reports a single run's."""
    with jax.set_mesh(self.mesh):
      results = jax.device_get(self._eval_jit(self.members, params))
    return [{f"{split}/{k}": float(v) for split, collection in results.items()
             for k, v in objective.finalize(metrics_lib.means(
                 metrics_lib.member(collection, i))).items()}
            for i, objective in enumerate(self.setup.member_objectives)]

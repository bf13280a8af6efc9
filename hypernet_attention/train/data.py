"""Where training batches come from: one interface, two kinds of source.

  OnDeviceSource  a synthetic task (SRAVEN, fuzzy logic) whose batch is a pure function
                  of (key, batch size, split), generated *inside* the jitted train step:
                  no host input pipeline, and the step number is the data position.
  HostSource      a host-side pipeline (seqio / tf.data, `tasks/c4.py`, or Grain,
                  `tasks/c4_grain.py`): every process reads its own slice (shard `process_index` of
                  `process_count`), `to_global` turns the slices into one global `jax.Array` per
                  feature on the mesh, and the jitted step takes the batch as an argument. The
                  iterator's position is saved inside each Orbax checkpoint (`checkpoint_item`:
                  Grain's own handler for a Grain iterator, `DataIteratorArgs` for the others), so a
                  resumed run neither replays nor skips data.

The loop asks only `source.on_device`; everything task-specific stays in the objective."""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable, ClassVar, Iterable, Mapping

from etils import epath
import jax
import numpy as np
import orbax.checkpoint as ocp

from hypernet_attention.train import sharding


@dataclasses.dataclass(frozen=True)
class OnDeviceSource:
  """A jittable task: `task.sample(key, batch_size, split)` and `task.splits`."""
  task: Any
  on_device: ClassVar[bool] = True

  @property
  def splits(self) -> tuple[str, ...]:
    return tuple(self.task.splits)

  def sample(self, key: jax.Array, batch_size: int, split: str) -> Any:
    return self.task.sample(key, batch_size, split)

  def example(self, batch_size: int) -> Any:
    """Shapes and dtypes of a global training batch (nothing is computed)."""
    return jax.eval_shape(lambda k: self.sample(k, batch_size, "train"), jax.random.key(0))


@dataclasses.dataclass(frozen=True)
class HostSource:
  """Per-process numpy batches from a host pipeline.

  train(seed, local_batch_size, process_index, process_count): an endless iterator with
    `save(directory)` / `restore(directory)` of its position (e.g. `c4.DataIterator`).
  evaluate(split, local_batch_size, num_batches, process_index, process_count): the
    split's first `num_batches` batches, the same ones every time.
  example(global_batch_size): shapes and dtypes of a global batch."""
  train: Callable[..., Any]
  evaluate: Callable[..., Iterable[Mapping[str, np.ndarray]]]
  splits: tuple[str, ...]
  example: Callable[[int], Any]
  on_device: ClassVar[bool] = False


def token_rows_example(sequence_length: int) -> Callable[[int], Any]:
  """`HostSource.example` of the language-model batches {'inputs', 'targets', 'weights'}."""
  def example(batch_size):
    row = jax.ShapeDtypeStruct((batch_size, sequence_length), np.int32)
    return {"inputs": row, "targets": row, "weights": row}
  return example


RANDOM_TOKEN_SPLITS = ("train", "validation")  # As `tasks/c4.py`'s, so eval configs agree.


class RandomTokens:
  """An endless iterator of uniformly random token rows {'inputs', 'targets', 'weights'}
  (B, T) int32, `targets` = `inputs` shifted by one, as `c4.batches` yields them.

  Why: it times the language model's real training step where TensorFlow, seqio and the C4
  vocabulary are not (a lent GPU image; `benchmark_training.py --synthetic_tokens`). The
  step's cost does not depend on which tokens it reads. Batch i is a function of (seed,
  process, i), so `save` / `restore` keep only i."""

  def __init__(self, seed: int, batch_size: int, sequence_length: int, vocab_size: int,
               process_index: int = 0, process_count: int = 1):
    self._shape, self._vocab_size = (batch_size, sequence_length + 1), vocab_size
    self._seed, self._index = (seed, process_index), 0
    self._name = f"process_{process_index}-of-{process_count}.json"

  def __iter__(self):
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    rng = np.random.default_rng((*self._seed, self._index))
    self._index += 1
    rows_BT1 = rng.integers(0, self._vocab_size, self._shape, dtype=np.int32)
    return {"inputs": rows_BT1[:, :-1], "targets": rows_BT1[:, 1:],
            "weights": np.ones_like(rows_BT1[:, 1:])}

  def save(self, directory: str) -> None:
    epath.Path(directory).mkdir(parents=True, exist_ok=True)
    (epath.Path(directory) / self._name).write_text(str(self._index))

  def restore(self, directory: str) -> None:
    self._index = int((epath.Path(directory) / self._name).read_text())


def local_batch_size(global_batch_size: int, what: str = "batch_size") -> int:
  """This process's share of a global batch; raises unless every process gets the same."""
  count = jax.process_count()
  if global_batch_size % count:
    raise ValueError(f"{what}={global_batch_size} is not divisible by the {count} "
                     f"processes that each read a slice; use a multiple of {count}.")
  return global_batch_size // count


def to_global(local_batch: Mapping[str, np.ndarray], mesh: jax.sharding.Mesh,
              global_batch_size: int) -> dict[str, jax.Array]:
  """Host-local slices (leading axis = this process's rows) -> global arrays on `mesh`.

  Rows are split over the mesh's batch axes (`sharding.batch_sharding`); each process's
  slice lands on its own devices. Fails loudly, naming the feature, when the slices do
  not make up the global batch or the batch does not divide over the devices."""
  sharding.check_batch_size(global_batch_size, mesh)
  out = {}
  for name, x in local_batch.items():
    x = np.asarray(x)
    if x.shape[0] * jax.process_count() != global_batch_size:
      raise ValueError(
          f"host batch feature {name!r} has {x.shape[0]} rows x {jax.process_count()} "
          f"processes != global batch_size={global_batch_size}; allowed: "
          f"{global_batch_size // jax.process_count()} rows per process.")
    out[name] = jax.make_array_from_process_local_data(
        sharding.batch_sharding(mesh, x.ndim), x, (global_batch_size,) + x.shape[1:])
  return out


def global_shardings(example: Any, mesh: jax.sharding.Mesh) -> Any:
  """The `in_shardings` of a global batch shaped like `example`."""
  return jax.tree.map(lambda x: sharding.batch_sharding(mesh, len(x.shape)), example)


class DataIteratorHandler(ocp.CheckpointHandler):
  """Orbax item handler: every process writes / reads its own iterator state file
  (`process_{i}-of-{n}.*`, see `c4.DataIterator`) inside the checkpoint step's folder, so
  the data position is finalized (or lost) atomically with the model state."""

  def save(self, directory: epath.Path, args: "DataIteratorArgs"):
    args.iterator.save(str(directory))

  def restore(self, directory: epath.Path, args: "DataIteratorArgs"):
    args.iterator.restore(str(directory))
    return args.iterator


@ocp.args.register_with_handler(DataIteratorHandler, for_save=True, for_restore=True)
@dataclasses.dataclass
class DataIteratorArgs(ocp.args.CheckpointArgs):
  iterator: Any


class GrainIteratorHandler(ocp.CheckpointHandler):
  """Grain's own Orbax handler (`grain.checkpoint.CheckpointHandler`: every process writes
  its iterator's `get_state()` as `process_{i}-of-{n}.json`, and restores it with
  `set_state`), imported on first use: every `Checkpointer` registers this item, and runs
  without Grain (or without it installed) never load it."""

  def _grain(self) -> Any:
    return importlib.import_module("grain").checkpoint.CheckpointHandler()

  def save(self, directory: epath.Path, args: "GrainIteratorArgs"):
    self._grain().save(directory, args=args)

  def restore(self, directory: epath.Path, args: "GrainIteratorArgs"):
    return self._grain().restore(directory, args=args)


@ocp.args.register_with_handler(GrainIteratorHandler, for_save=True, for_restore=True)
@dataclasses.dataclass
class GrainIteratorArgs(ocp.args.CheckpointArgs):
  item: Any  # A Grain DatasetIterator or DataLoaderIterator (Grain's handler reads `.item`).


def _is_grain(iterator: Any) -> bool:
  return hasattr(iterator, "get_state") and hasattr(iterator, "set_state")


def checkpoint_item(iterator: Any) -> tuple[str, ocp.args.CheckpointArgs]:
  """(Orbax item name, its args) that hold `iterator`'s position in a checkpoint.

  A Grain iterator (it has Grain's `get_state` / `set_state`) goes to item `grain`,
  written by Grain's handler; any other (`c4.DataIterator`, `RandomTokens`) to item `data`,
  through its own `save` / `restore`. Distinct names keep a checkpoint of one data path
  from being resumed by the other."""
  if _is_grain(iterator):
    return "grain", GrainIteratorArgs(iterator)
  return "data", DataIteratorArgs(iterator)


def position_file(iterator: Any) -> str:
  """This process's position file inside its `checkpoint_item`'s folder."""
  if _is_grain(iterator):
    return f"process_{jax.process_index()}-of-{jax.process_count()}.json"
  return epath.Path(iterator.path("")).name + ".index"

"""Latent codes of a restored run: which (query, key) entries, on which problems, with labels.

Shape letters:
  B batch (problems), N samples (B x probed features), L layers, H heads, P probed
  (query, key) pairs, C code width per sample and layer (H x keys per sample),
  M meaning width of a task (rules per feature, or term presence).

The codes are read through the *materialized* attention path: `MultiHeadAttention` sows
`intermediates/layers_l/attention/latent_code` (B, H, Q, K) whenever `intermediates` is
mutable, and the fused kernels never hold it. `deterministic=True`, so no dropout. Only the
probed entries leave the jitted forward pass.

Settings (after the paper's Figs. 2B and 5 and the authors' callbacks.py; each experiment's
record names its setting, `registry.Experiment.probe`):
  sraven       splits `test_unpermuted` (in-distribution tasks, to fit) and
               `ood_unpermuted` (held-out rule combinations, to score); no feature permutation, so
               slot f *is* feature f. For each probed feature f the query token of f in the answer
               panel attends to the tokens of f in the first G-1 panels of the last row: query
               (G*G-1)*K + f, keys (G*(G-1)+j)*K + f for j < G-1 (G=3: query 8K+f, keys 6K+f, 7K+f;
               K=4, f=3 is the authors' 35 -> [27, 31]). Code = H x (G-1) entries per layer; label =
               rule of f; task = the rule multiset; unit (the set of samples sharing a label) =
               (task, f); stratum = f. `features='all'` probes every feature (K samples per
               problem), `features='last'` only f = K-1 (the authors' exact setting).
  fuzzy_logic  splits `test` (training tasks, fresh samples) and `ood` (held-out
               combinations of known terms); the query token (the last) attending to itself, per
               layer: H entries. Labels = which known terms the task contains (multi-label); unit =
               task; one stratum. `query='fixed'` (default, the authors' `valid_fixed_query` /
               `test_fixed_query` loaders that their latent callback reads): every problem's query
               point x_q is one fixed point (`fixed_query_point`), only the context varies;
               `query='random'`: x_q drawn per problem like the context. The query token's self-code
               in layer 0 is a function of that token alone under HYLA and linear attention (its y
               is zeroed; RMSHead normalizes across the heads of one pair, linear attention not at
               all), so with random queries it varies with x_q and carries no task, and in later
               layers x_q's variation swamps the context's (experiments/results/probing.md, "Fig. 2B
               at paper scale").
SRAVEN's query tokens (the answer panel's zero tokens) are the same in every problem: its
only query choice is 'fixed'.
"""

from __future__ import annotations

import dataclasses
import functools
import io
from typing import Any

import chex
from etils import epath
from flax import traverse_util
import jax
import jax.numpy as jnp
import numpy as np
import tqdm

from hypernet_attention.runs import registry
from hypernet_attention.runs import run_files
from hypernet_attention.tasks import sraven as sraven_lib

FEATURE_CHOICES = ("all", "last")
QUERY_CHOICES = ("fixed", "random")
PROBE_SEED = 1234  # Problems probed: a fixed key, independent of the run's training seed.
FIXED_QUERY_STREAM = 999  # fold_in of PROBE_SEED that draws the fixed fuzzy-logic query


def sraven_pairs(num_features: int, grid_size: int, features) -> tuple[np.ndarray, np.ndarray]:
  """Query index (F,) and key indices (F, G-1) of each probed feature f (formula above)."""
  features = np.asarray(features, np.int32)
  K, G = num_features, grid_size
  query_F = (G * G - 1) * K + features
  key_FJ = (G * (G - 1) + np.arange(G - 1))[None, :] * K + features[:, None]
  return query_F, key_FJ


@dataclasses.dataclass(frozen=True)
class Codes:
  """Probed codes with their labels; one row per sample. Saved as `codes_<step>.npz`."""
  codes_NLC: np.ndarray  # float32
  labels: np.ndarray  # (N,) int class ids, or (N, T) {0, 1} term presence
  task_N: np.ndarray  # task id (row of `task_meaning_M`)
  unit_N: np.ndarray  # samples that share a label (SRAVEN: (task, feature))
  stratum_N: np.ndarray  # permutations shuffle labels within a stratum (SRAVEN: feature)
  split_N: np.ndarray  # index into `split_names`
  target_N: np.ndarray  # the answer the model must give (SRAVEN value of f; fuzzy y)
  task_meaning: np.ndarray  # (num_tasks, M): rule tuple per task, or term presence
  split_names: np.ndarray  # (fit split, score split)
  class_names: np.ndarray  # rule names, or term names
  experiment: str
  setting: str
  step: int
  code_axes: str  # what the C axis holds

  PER_SAMPLE = ("codes_NLC", "labels", "task_N", "unit_N", "stratum_N", "split_N", "target_N")

  def __post_init__(self):
    # One row per sample in every per-sample array (a saved file included).
    chex.assert_rank(self.codes_NLC, 3)
    chex.assert_equal_shape_prefix([getattr(self, k) for k in self.PER_SAMPLE], 1)

  @property
  def multilabel(self) -> bool:
    return self.labels.ndim == 2

  def save(self, path: str) -> None:
    arrays = {f.name: np.asarray(getattr(self, f.name)) for f in dataclasses.fields(self)}
    arrays["axes"] = np.array(["sample", "layer", "code"])
    npz = io.BytesIO()
    np.savez_compressed(npz, **arrays)
    run_files.write_bytes(path, npz.getvalue())

  @classmethod
  def load(cls, path: str) -> "Codes":
    with np.load(io.BytesIO(epath.Path(path).read_bytes()), allow_pickle=False) as data:
      values = {f.name: data[f.name] for f in dataclasses.fields(cls)}
    for name in ("experiment", "setting", "code_axes"):
      values[name] = str(values[name])
    values["step"] = int(values["step"])
    return cls(**values)

  def split(self, index: int) -> "Codes":
    keep = self.split_N == index
    return dataclasses.replace(self, **{k: getattr(self, k)[keep] for k in self.PER_SAMPLE})


class SRavenSetting:
  """Rule decoding on unpermuted SRAVEN problems (module docstring)."""
  splits = ("test_unpermuted", "ood_unpermuted")

  def __init__(self, task: sraven_lib.SRaven, features: str = "all", query: str = "fixed"):
    if query != "fixed":
      raise ValueError(f"query={query!r} for sraven; allowed: 'fixed' (its query tokens are "
                       "the answer panel's zeros in every problem)")
    self.task = task
    K = task.num_features
    self.features = np.arange(K) if features == "all" else np.array([K - 1])
    self.name = f"sraven/features={features}"
    query_F, key_FJ = sraven_pairs(K, task.grid_size, self.features)
    self.pairs_per_sample = key_FJ.shape[1]
    self.query_P = np.repeat(query_F, key_FJ.shape[1])
    self.key_P = key_FJ.reshape(-1)
    combos = np.concatenate([task.combinations("test"), task.combinations("ood")])
    self.task_meaning = combos  # sorted multiset = the rule of each feature
    self._task_id = {tuple(c): i for i, c in enumerate(combos)}
    self.class_names = np.array(sraven_lib.RULE_NAMES)
    self.code_axes = f"head x key (keys: the G-1={key_FJ.shape[1]} panels before the answer)"

  def batch(self, key: jax.Array, size: int, split: str) -> dict[str, jax.Array]:
    return self.task.sample(key, size, split)

  def samples(self, batch, codes_BLHP) -> dict[str, np.ndarray]:
    """One sample per (problem, probed feature)."""
    B, L, H, _ = codes_BLHP.shape
    S = len(self.features)
    chex.assert_shape(codes_BLHP, (B, L, H, len(self.query_P)))
    codes_BSLC = codes_BLHP.reshape(B, L, H, S, -1).transpose(0, 3, 1, 2, 4).reshape(B, S, L, -1)
    rules_BK = np.asarray(batch["rules"])
    task_B = np.array([self._task_id[tuple(r)] for r in rules_BK])
    answer_BK = np.asarray(batch["grid"])[:, -1, -1, :]
    feature_BS = np.broadcast_to(self.features, (B, S))
    task_BS = np.broadcast_to(task_B[:, None], (B, S))
    return dict(codes_NLC=codes_BSLC.reshape(B * S, L, -1),
                labels=rules_BK[:, self.features].reshape(-1),
                task_N=task_BS.reshape(-1),
                unit_N=(task_BS * self.task.num_features + feature_BS).reshape(-1),
                stratum_N=feature_BS.reshape(-1),
                target_N=answer_BK[:, self.features].reshape(-1).astype(np.float32))


class FuzzyLogicSetting:
  """Term decoding from the query token's code of attending to itself (module docstring)."""
  splits = ("test", "ood")

  def __init__(self, task, features: str = "all", query: str = "fixed"):
    del features  # one query token per sequence
    self.task = task
    self.query = query
    self.name = f"fuzzy_logic/query_self/query={query}"
    last = task.num_examples - 1
    self.query_P, self.key_P = np.array([last]), np.array([last])
    self.pairs_per_sample = 1
    self.num_known = 2 ** task.num_variables - task.num_unseen_terms
    combos = np.concatenate([task.combinations("test"), task.combinations("ood")])
    self.task_meaning = np.zeros((len(combos), self.num_known), np.int32)
    np.put_along_axis(self.task_meaning, combos, 1, axis=1)
    self._task_id = {tuple(c): i for i, c in enumerate(combos)}
    self._bit_weights = 2 ** np.arange(task.num_variables - 1, -1, -1)
    self.class_names = np.array(["&".join(f"x{l}" if b else f"~x{l}" for l, b in enumerate(bits))
                                 for bits in task.terms_table[:self.num_known]])
    self.code_axes = "head (query token attending to itself)"

  def batch(self, key: jax.Array, size: int, split: str) -> dict[str, jax.Array]:
    """`task.sample`'s batch; with the fixed query, x_q := `fixed_query_point` and the
    targets re-evaluated (the tokens hide the query's y, so every query token is equal)."""
    batch = self.task.sample(key, size, split)
    if self.query == "random":
      return batch
    x_BNL = batch["x"].at[:, -1].set(fixed_query_point(self.task.num_variables))
    return dict(batch, x=x_BNL, y=self.task.evaluate(batch["terms"], x_BNL))

  def samples(self, batch, codes_BLHP) -> dict[str, np.ndarray]:
    B = codes_BLHP.shape[0]
    chex.assert_shape(codes_BLHP, (B, None, None, len(self.query_P)))
    terms_BK = np.asarray(batch["terms"]) @ self._bit_weights
    task_B = np.array([self._task_id[tuple(t)] for t in terms_BK])
    return dict(codes_NLC=codes_BLHP.reshape(B, codes_BLHP.shape[1], -1),
                labels=self.task_meaning[task_B], task_N=task_B, unit_N=task_B,
                stratum_N=np.zeros(B, np.int64),
                target_N=np.asarray(batch["y"])[:, -1].astype(np.float32))


def fixed_query_point(num_variables: int) -> jax.Array:
  """The one query point of `query='fixed'`: U[0,1]^L from a fixed key (as the authors
  draw theirs once per run), the same for both splits and for the step-0 parameters; its
  stream is apart from the problems' (keyed by split index, then batch index)."""
  return jax.random.uniform(jax.random.fold_in(jax.random.key(PROBE_SEED), FIXED_QUERY_STREAM),
                            (num_variables,))


def probed_experiments() -> list[str]:
  """The experiments whose record names a probe setting."""
  return [name for name, e in registry.EXPERIMENTS.items() if e.probe is not None]


def setting_class(experiment: str):
  """The probe setting of `experiment` (its record's `probe`); ValueError if it has none."""
  record = registry.EXPERIMENTS.get(experiment)
  if record is None or record.probe is None:
    raise ValueError(f"experiment {experiment!r} has no probe setting; allowed: "
                     f"{probed_experiments()}")
  return registry.load(record.probe)


def make_setting(experiment: str, task, features: str = "all", query: str = "fixed"):
  cls = setting_class(experiment)
  if features not in FEATURE_CHOICES:
    raise ValueError(f"features={features!r}; allowed: {FEATURE_CHOICES}")
  if query not in QUERY_CHOICES:
    raise ValueError(f"query={query!r}; allowed: {QUERY_CHOICES}")
  return cls(task, features, query)


@functools.lru_cache(maxsize=8)
def code_collector(model, query_P: tuple[int, ...], key_P: tuple[int, ...]):
  """Jitted (params, inputs) -> (outputs, codes (B, L, H, P)) through the materialized path.

  Cached per (model, pairs): a run's trained and step-0 parameters share one compilation.
  """
  query_P, key_P = jnp.asarray(query_P), jnp.asarray(key_P)

  @jax.jit
  def collect(params, inputs):
    outputs, state = model.apply({"params": params}, inputs, deterministic=True,
                                 mutable=["intermediates"])
    flat = traverse_util.flatten_dict(state["intermediates"])
    layers = sorted((k for k in flat if k[-1] == "latent_code"),
                    key=lambda k: int(k[0].split("_")[-1]))
    # Each layer sows one (B, H, Q, K) latent code over the same batch and heads.
    chex.assert_rank([flat[k][0] for k in layers], 4)
    chex.assert_equal_shape([flat[k][0] for k in layers])
    codes = [flat[k][0][:, :, query_P, key_P] for k in layers]
    return outputs, jnp.stack(codes, 1)
  return collect


def extract_codes(run: Any, num_problems: int, batch_size: int = 256, features: str = "all",
                  progress: bool = True, seed: int = PROBE_SEED, query: str = "fixed") -> Codes:
  """Probed codes of `run` (a `restore.RestoredRun`) on `num_problems` per split."""
  if num_problems < 1:
    raise ValueError(f"num_problems={num_problems}; allowed: a positive integer")
  setting = make_setting(run.config.experiment, run.objective.task, features, query)
  collect = code_collector(run.model, tuple(setting.query_P.tolist()),
                           tuple(setting.key_P.tolist()))
  sizes = [min(batch_size, num_problems - s) for s in range(0, num_problems, batch_size)]
  parts = []
  bar = tqdm.tqdm(total=num_problems * len(setting.splits), unit="problem", disable=not progress,
                  desc=f"codes step {run.step}", leave=False)
  for split_index, split in enumerate(setting.splits):
    for i, size in enumerate(sizes):
      key = jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), split_index), i)
      batch = setting.batch(key, size, split)
      _, codes_BLHP = collect(run.params, run.objective.encode(batch)[0])
      sample = setting.samples(batch, np.asarray(codes_BLHP, np.float32))
      sample["split_N"] = np.full(len(sample["task_N"]), split_index, np.int32)
      parts.append(sample)
      bar.update(size)
  bar.close()
  merged = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
  return Codes(**merged, task_meaning=setting.task_meaning,
               split_names=np.array(setting.splits), class_names=setting.class_names,
               experiment=run.config.experiment, setting=setting.name, step=run.step,
               code_axes=setting.code_axes)


def codes_path(out_dir: str, step: int) -> str:
  return str(epath.Path(out_dir) / f"codes_{step}.npz")

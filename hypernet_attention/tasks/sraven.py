"""SRAVEN, symbolic Raven's progressive matrices (the paper's Fig. 3): a jittable generator.

Shape letters:
  B batch, G grid size (rows = columns = G), K features per panel, F values per feature,
  R rules, T tokens; `sraven_analysis.py` adds C chains and P readings.

A problem is a G x G grid of panels, each panel a K-tuple of integers in [0, F). Every
feature f follows one of 8 rules along *every* row (mod F); the rule multiset of a problem
is its task, and a fixed, seeded 25% of the C(8+K-1, K) multisets is held out (`ood`).
Per problem, each grid column shows the K features in its own random order, the same for
all rows, so the model must also find which slots of different columns belong together.

Rule assignment: a task's sorted multiset is assigned to features 0..K-1 in order (as the
authors do); with `permute_features=True` every column is permuted anyway, so the order
carries no information.

Splits: `train` and `test` draw from the in-distribution multisets, `ood` from the held-out
ones; `*_unpermuted` are the same with identity permutations (for probing). The split name
is folded into the key, so `train` and `test` batches differ for the same key, while
`ood_unpermuted` with key k is exactly `ood` with key k before its columns were permuted.

Ambiguity and accuracy ceilings (`sraven_analysis.py`, measured by experiments/task_stats.py,
experiments/reference.md "The tasks"): reported accuracies should be read against these, not 1."""

from __future__ import annotations

import functools
import itertools
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax

from hypernet_attention.tasks import heldout
from hypernet_attention.tasks import sraven_analysis

RULE_NAMES = (
    'constant', 'progression+1', 'progression+2', 'progression-1', 'progression-2',
    'addition', 'subtraction', 'distribute_three')
_BASE_SPLITS = ('train', 'test', 'ood')
SPLITS = _BASE_SPLITS + tuple(f'{s}_unpermuted' for s in _BASE_SPLITS)


def _randint(bits, n):
  """Integers in [0, n) from uint32 words; the modulo bias is below n / 2**32."""
  return (bits % jnp.uint32(n)).astype(jnp.int32)


def memory_estimate(num_features: int, num_values: int = 8, grid_size: int = 3,
                    ceiling_batch: int = 0) -> int:
  """Bytes of host memory the task's tables need, before building them (a lower bound).

  The split tables hold every multiset of K of the 8 rules (C(K+7, K) rows, built as Python
  tuples first). The accuracy ceilings (`ceiling_batch` > 0 problems at a time) add the
  (K!)**(G-1) readings (`_readings`, built as Python arrays) and a (B, P, K, F) array of
  possible answers per batch: that term is what explodes (K=6: ~25 GB at B=1024)."""
  K, G, F = num_features, grid_size, num_values
  tuple_bytes = 56 + 8 * K  # A Python tuple of K small ints, plus its list slot.
  total = math.comb(K + len(RULE_NAMES) - 1, K) * (tuple_bytes + 3 * 4 * K)
  if ceiling_batch > 0:
    readings = math.factorial(K) ** (G - 1)
    total += readings * (2 * (112 + 8 * K) + 2 * 8 * K)  # Two arrays of K per reading.
    total += ceiling_batch * readings * K * (F + 4)  # possible_BPKF (bool) + truth_BPK.
  return total


def config_memory(config) -> int:
  """`memory_estimate` of a run's config (its record's `memory`), before building the
  tables: the split tables, plus the ceilings' readings when `eval.ceiling_problems` > 0."""
  return memory_estimate(
      config.task.num_features, config.task.num_values, config.task.get('grid_size', 3),
      ceiling_batch=1024 if config.eval.ceiling_problems > 0 else 0)


class SRaven(sraven_analysis.Analysis, heldout.SplitTables):
  """Generator of SRAVEN problems with compositional train/ood splits (analysis inherited).

  Attributes:
    rule_names: the 8 rule names, index = rule id.
    progression_steps: the four progressions' steps (rule ids 1-4).
    splits: the split names `sample` accepts."""

  rule_names = RULE_NAMES
  progression_steps = (1, 2, -1, -2)
  splits = SPLITS

  def __init__(self, num_features: int = 4, num_values: int = 8, grid_size: int = 3,
               holdout_fraction: float = 0.25, permute_features: bool = True, seed: int = 0):
    if not isinstance(num_features, int) or num_features < 1:
      raise ValueError(f'num_features={num_features!r}; allowed: an int >= 1.')
    if not isinstance(grid_size, int) or grid_size < 3:
      raise ValueError(f'grid_size={grid_size!r}; allowed: an int >= 3.')
    if not isinstance(num_values, int) or num_values < grid_size:
      raise ValueError(
          f'num_values={num_values!r}; allowed: an int >= grid_size={grid_size} '
          '(distribute_three needs that many distinct values).')
    self.num_features = num_features
    self.num_values = num_values
    self.grid_size = grid_size
    self.holdout_fraction = holdout_fraction
    self.permute_features = permute_features
    self.seed = seed
    self.num_rules = len(RULE_NAMES)
    combos = np.array(list(itertools.combinations_with_replacement(
        range(self.num_rules), num_features)), np.int32)
    train, ood = heldout.split(
        combos, holdout_fraction, self.num_rules, seed,
        what=f'rule combinations (num_features={num_features})')
    self._set_combinations({'train': train, 'test': train, 'ood': ood})

  @property
  def seq_len(self) -> int:
    return self.grid_size * self.grid_size * self.num_features

  def _rule_values(self, bits, shape):
    """Values of every rule for `shape` = (B, K) features: (B, K, R, G rows, G cols).

    `bits` (B, K, W) uint32 are the random words of each feature (W = G + G*(G-1) + F + G*G)."""
    G, F = self.grid_size, self.num_values
    start, ops, set_keys, row_keys = jnp.split(bits, np.cumsum([G, G * (G - 1), F]), axis=-1)
    col = jnp.arange(G)
    start = _randint(start, F)[..., None]  # (B, K, G, 1)
    constant = jnp.broadcast_to(start, shape + (G, G))
    progressions = [(start + d * col) % F for d in self.progression_steps]
    ops = _randint(ops, F).reshape(shape + (G, G - 1))
    add = jnp.concatenate([ops, ops.sum(-1, keepdims=True) % F], -1)
    sub_last = (ops[..., :1] - ops[..., 1:].sum(-1, keepdims=True)) % F
    sub = jnp.concatenate([ops, sub_last], -1)
    # distribute_three: G distinct values (a random prefix of a permutation of [0, F)),
    # each row an independent permutation of them. Sorting random words gives uniform
    # permutations up to ties, which have probability ~2**-32.
    values = jnp.argsort(set_keys, -1)[..., :G]
    order = jnp.argsort(row_keys.reshape(shape + (G, G)), -1)
    distribute = jnp.take_along_axis(
        jnp.broadcast_to(values[..., None, :], shape + (G, G)), order, -1)
    return jnp.stack([constant, *progressions, add, sub, distribute], -3)

  @functools.partial(jax.jit, static_argnums=(0, 2, 3))
  def sample(self, key: jax.Array, batch_size: int, split: str,
             tables=None) -> dict[str, jax.Array]:
    """A batch of problems: a pure function of (key, batch_size, split).

    `tables` (default: this task's `split_tables()`) replaces the held-out split's rule
    tables by arrays of the same shapes: a population of runs passes each member's own.

    Returns:
      grid: int32 (B, G, G, K), [row, column, feature slot], values in [0, F).
      rules: int32 (B, K), rule id of each original feature f.
      perms: int32 (B, G, K); grid[b, r, c, j] == unpermuted[b, r, c, perms[b, c, j]]."""
    base = self._check_split(split)
    B, G, K, F = batch_size, self.grid_size, self.num_features, self.num_values
    # One draw of random words for everything: every separate jax.random call adds about
    # a second of XLA compile time on CPU.
    words = G + G * (G - 1) + F + G * G
    bits = jax.random.bits(jax.random.fold_in(key, _BASE_SPLITS.index(base)),
                           (B, 1 + K * words + G * K), jnp.uint32)
    table = (self._tables if tables is None else tables)[base]
    rules = table[_randint(bits[:, 0], table.shape[0])]
    all_rules_BKRGG = self._rule_values(bits[:, 1:1 + K * words].reshape(B, K, words), (B, K))
    chosen_BKGG = jnp.take_along_axis(
        all_rules_BKRGG, rules[:, :, None, None, None], axis=2)[:, :, 0]
    unpermuted_BGGK = jnp.transpose(chosen_BKGG, (0, 2, 3, 1))
    if self.permute_features and not split.endswith('_unpermuted'):
      perms_BGK = jnp.argsort(bits[:, 1 + K * words:].reshape(B, G, K), -1)
    else:
      perms_BGK = jnp.broadcast_to(jnp.arange(K), (B, G, K))
    grid_BGGK = jnp.take_along_axis(unpermuted_BGGK, perms_BGK[:, None], axis=-1)
    chex.assert_shape([grid_BGGK, rules, perms_BGK], [(B, G, G, K), (B, K), (B, G, K)])
    return {'grid': grid_BGGK.astype(jnp.int32), 'rules': rules.astype(jnp.int32),
            'perms': perms_BGK.astype(jnp.int32)}

  def encode(self, batch: dict[str, jax.Array]) -> tuple[jax.Array, jax.Array]:
    """Model inputs (B, G*G*K, F) float32 and targets (B, K) int32.

    One-hot tokens of the first G*G-1 panels in row-major order, K tokens per panel in
    slot order, then K zero tokens for the query panel; targets are the query panel."""
    grid = batch['grid']
    B, K = grid.shape[0], self.num_features
    G = self.grid_size
    chex.assert_shape(grid, (B, G, G, K))
    chex.assert_type(grid, int)
    panels_BPK = grid.reshape(B, -1, K)
    context_BTF = jax.nn.one_hot(panels_BPK[:, :-1].reshape(B, -1), self.num_values,
                                 dtype=jnp.float32)
    query_BKF = jnp.zeros((B, K, self.num_values), jnp.float32)
    tokens_BTF = jnp.concatenate([context_BTF, query_BKF], 1)
    chex.assert_shape(tokens_BTF, (B, G * G * K, self.num_values))
    return tokens_BTF, panels_BPK[:, -1].astype(jnp.int32)

  @property
  def output_dim(self) -> int:
    """Outputs per token: logits over the F values."""
    return self.num_values

  @property
  def chance_accuracy(self) -> float:
    """A uniform guess gets all K features of the answer panel right with probability
    F**-K (accuracy counts a panel right only if every feature is)."""
    return float(self.num_values) ** -self.num_features

  def metrics(self, logits_BTF: jax.Array, batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """Per-problem (B,) metrics of the logits at the K query tokens: cross-entropy
    `loss`, `accuracy` (every feature right) and `accuracy_feature<k>`."""
    _, targets_BK = self.encode(batch)
    num_k = targets_BK.shape[1]
    chex.assert_shape(logits_BTF, (targets_BK.shape[0], None, self.num_values))
    logits_BKF = logits_BTF[:, -num_k:].astype(jnp.float32)
    ce_BK = optax.softmax_cross_entropy_with_integer_labels(logits_BKF, targets_BK)
    correct_BK = jnp.argmax(logits_BKF, -1) == targets_BK
    return {'loss': ce_BK.mean(-1), 'accuracy': correct_BK.all(-1).astype(jnp.float32),
            **{f'accuracy_feature{k}': correct_BK[:, k].astype(jnp.float32) for k in range(num_k)}}

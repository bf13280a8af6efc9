"""SRAVEN, symbolic Raven's progressive matrices (the paper's Fig. 3): a jittable generator.

Shape letters:
  B batch, G grid size (rows = columns = G), K features per panel, F values per feature,
  R rules, C chains (one slot per column, K**G of them), P readings ((K!)**(G-1)), T tokens.

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

Ambiguity (`is_ambiguous`) and accuracy ceilings, measured by experiments/task_stats.py
(experiments/reference.md, "The tasks"): reported accuracies should be read against these,
not against 1.
"""

from __future__ import annotations

import collections
import functools
import itertools
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax

from hypernet_attention.tasks import heldout

RULE_NAMES = (
    'constant', 'progression+1', 'progression+2', 'progression-1', 'progression-2',
    'addition', 'subtraction', 'distribute_three')
_PROGRESSION_STEPS = (1, 2, -1, -2)
_BASE_SPLITS = ('train', 'test', 'ood')
SPLITS = _BASE_SPLITS + tuple(f'{s}_unpermuted' for s in _BASE_SPLITS)
AMBIGUITY_DEFINITIONS = ('panel', 'authors')


def _randint(bits, n):
  """Integers in [0, n) from uint32 words; the modulo bias is below n / 2**32."""
  return (bits % jnp.uint32(n)).astype(jnp.int32)


def memory_estimate(num_features: int, num_values: int = 8, grid_size: int = 3,
                    ceiling_batch: int = 0) -> int:
  """Bytes of host memory the task's tables need, before building them (a lower bound).

  The split tables hold every multiset of K of the 8 rules (C(K+7, K) rows, built as Python
  tuples first). The accuracy ceilings (`ceiling_batch` > 0 problems at a time) add the
  (K!)**(G-1) readings (`_readings`, built as Python arrays) and a (B, P, K, F) array of
  possible answers per batch: that term is what explodes (K=6: ~25 GB at B=1024).
  """
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


class SRaven:
  """Generator of SRAVEN problems with compositional train/ood splits.

  Attributes:
    rule_names: the 8 rule names, index = rule id.
    splits: the split names `sample` accepts.
  """

  rule_names = RULE_NAMES
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
    self._combinations = {'train': train, 'test': train, 'ood': ood}
    self._tables = {k: jnp.asarray(v) for k, v in self._combinations.items()}

  @property
  def seq_len(self) -> int:
    return self.grid_size * self.grid_size * self.num_features

  def _check_split(self, split):
    if split not in SPLITS:
      raise ValueError(f'Unknown split {split!r}; allowed: {SPLITS}.')
    return split.removesuffix('_unpermuted')

  def split_tables(self) -> dict[str, jax.Array]:
    """The split's task tables {base split: (n, K) int32}, as `sample` reads them; their
    shapes depend on the task's sizes only, never on its seed."""
    return dict(self._tables)

  def combinations(self, split: str) -> np.ndarray:
    """Sorted rule multisets (n, K) of a split; `train` and `test` share theirs."""
    return self._combinations[self._check_split(split)].copy()

  # ---------------------------------------------------------------- sampling
  def _rule_values(self, bits, shape):
    """Values of every rule for `shape` = (B, K) features: (B, K, R, G rows, G cols).

    `bits` (B, K, W) uint32 are the random words of each feature (W = G + G*(G-1) + F + G*G).
    """
    G, F = self.grid_size, self.num_values
    start, ops, set_keys, row_keys = jnp.split(bits, np.cumsum([G, G * (G - 1), F]), axis=-1)
    col = jnp.arange(G)
    start = _randint(start, F)[..., None]  # (B, K, G, 1)
    constant = jnp.broadcast_to(start, shape + (G, G))
    progressions = [(start + d * col) % F for d in _PROGRESSION_STEPS]
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
      perms: int32 (B, G, K); grid[b, r, c, j] == unpermuted[b, r, c, perms[b, c, j]].
    """
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
    slot order, then K zero tokens for the query panel; targets are the query panel.
    """
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
    out = {'loss': ce_BK.mean(-1), 'accuracy': correct_BK.all(-1).astype(jnp.float32)}
    for k in range(num_k):
      out[f'accuracy_feature{k}'] = correct_BK[:, k].astype(jnp.float32)
    return out

  # -------------------------------------------------------------- ambiguity
  @functools.cached_property
  def _readings(self):
    """Readings as chain ids (P, K), and the answer slot of each chain (P, K).

    Built on first use: P = (K!)**(G-1) is 576 at K=4, G=3 but explodes beyond K=5, so
    the ambiguity checker is meant for small K; sampling does not need it.

    A reading links slot m of column 0 with slot p_c[m] of column c, for per-column
    permutations p_1..p_{G-1}; fixing column 0 removes relabelings of the same chains.
    Chain id = sum_c slot_c * K**(G-1-c).
    """
    G, K = self.grid_size, self.num_features
    perms = list(itertools.permutations(range(K)))
    chains, answer_slots = [], []
    for ps in itertools.product(perms, repeat=G - 1):
      slots = np.stack([np.arange(K)] + [np.array(p) for p in ps])  # (G, K)
      chains.append((slots * (K ** np.arange(G - 1, -1, -1))[:, None]).sum(0))
      answer_slots.append(slots[-1])
    return np.array(chains), np.array(answer_slots)

  def _chain_grids(self, grid_BGGK):
    """Every chain's G x G values: (B, C, G rows, G cols); the last entry is the answer."""
    G, K = self.grid_size, self.num_features
    slots_CG = np.array(list(itertools.product(range(K), repeat=G)))  # chain id order
    return grid_BGGK[:, :, np.arange(G)[None, :], slots_CG].transpose(0, 2, 1, 3)

  def _rule_fits(self, grid_BGGK, authors=False):
    """Whether each rule fits each chain's context, and its answer: 2 x (B, C, R)."""
    G, F = self.grid_size, self.num_values
    x = self._chain_grids(grid_BGGK)
    ctx, last = x[..., :G - 1, :], x[..., G - 1, :G - 1]  # (B,C,G-1,G), (B,C,G-1)
    fits, answers = [], []
    # constant
    fits.append(jnp.all(ctx == ctx[..., :1], (-1, -2)) & jnp.all(last == last[..., :1], -1))
    answers.append(last[..., 0])
    # progressions: every known neighbour difference equals the step (mod F)
    d_ctx, d_last = (jnp.diff(ctx, axis=-1) % F), (jnp.diff(last, axis=-1) % F)
    for d in _PROGRESSION_STEPS:
      fits.append(jnp.all(d_ctx == d % F, (-1, -2)) & jnp.all(d_last == d % F, -1))
      answers.append((last[..., -1] + d) % F)
    # addition / subtraction: checked on the complete rows; the last row has no check
    fits.append(jnp.all(ctx[..., :-1].sum(-1) % F == ctx[..., -1], -1))
    answers.append(last.sum(-1) % F)
    sub = lambda v: (v[..., 0] - v[..., 1:].sum(-1)) % F
    fits.append(jnp.all(sub(ctx[..., :-1]) == ctx[..., -1], -1))
    answers.append(sub(last))
    if authors:
      # The authors' looser check: complete rows are permutations of one multiset
      # (duplicates allowed), the last row's known values lie in it, and the answer is
      # the first sorted member matched least often by the last row.
      set_row = jnp.sort(ctx, -1)
      fits.append(jnp.all(set_row == set_row[..., :1, :], (-1, -2))
                  & jnp.all(jnp.any(last[..., :, None] == set_row[..., 0, None, :], -1), -1))
      matches = jnp.sum(last[..., :, None] == set_row[..., 0, None, :], -2)
      answers.append(jnp.take_along_axis(
          set_row[..., 0, :], jnp.argmin(matches, -1)[..., None], -1)[..., 0])
    else:
      # distribute_three: complete rows are permutations of one set of G distinct values;
      # the last row's known values are distinct members of it; the answer is the missing one.
      counts = jax.nn.one_hot(ctx, F, dtype=jnp.int32).sum(-2)  # (B,C,G-1,F)
      counts_last = jax.nn.one_hot(last, F, dtype=jnp.int32).sum(-2)  # (B,C,F)
      fits.append(jnp.all(counts <= 1, (-1, -2))
                  & jnp.all(counts == counts[..., :1, :], (-1, -2))
                  & jnp.all(counts_last <= counts[..., 0, :], -1))
      answers.append(jnp.argmax(counts[..., 0, :] - counts_last, -1))
    return jnp.stack(fits, -1), jnp.stack(answers, -1)

  _jit_rule_fits = functools.partial(jax.jit, static_argnums=0)(_rule_fits)

  def _possible_answers(self, grid_BGGK, authors=False):
    """(B, C, F) bool: values some rule that fits the chain's context predicts."""
    fits_BCR, answers_BCR = self._rule_fits(grid_BGGK, authors)
    F = self.num_values
    return jnp.any(fits_BCR[..., None] & (answers_BCR[..., None] == jnp.arange(F)), -2)

  def _reading_stats(self, grid_BGGK, authors=False):
    """Per reading: valid (B, P) and per chain `another value possible` (B, P, K)."""
    possible_BCF = self._possible_answers(grid_BGGK, authors)
    chains_PK, slots_PK = self._readings
    truth_BK = grid_BGGK[:, -1, -1, :]
    truth_BPK = truth_BK[:, slots_PK]
    possible_BPKF = possible_BCF[:, chains_PK]
    other_BPK = jnp.any(possible_BPKF & (jnp.arange(self.num_values) != truth_BPK[..., None]), -1)
    valid_BP = jnp.all(jnp.any(possible_BPKF, -1), -1)
    return valid_BP, other_BPK, possible_BPKF

  @functools.partial(jax.jit, static_argnums=(0, 2))
  def is_ambiguous(self, grid: jax.Array, definition: str = 'panel') -> jax.Array:
    """Whether a problem's answer panel is not determined by its context: bool (B,).

    A *reading* of the G*G-1 context panels is a choice of per-column feature
    permutations (which slot of each column continues which slot of column 0), together
    with, for every such chain of slots, any of the 8 rules that fits all of the chain's
    context rows (for the last row: its G-1 known entries). Each reading predicts an answer
    panel (one value per slot). Rules are not restricted to the split's combinations, and
    all permutations are considered even for unpermuted grids: a model cannot know either.

    definition='panel' (default): ambiguous iff some reading predicts an answer panel
      different from the true one, i.e. differs in at least one slot.
    definition='authors': the authors' check (smonsays/hypernetwork-attention,
      `check_is_ambiguous`): ambiguous iff some reading predicts a different value in
      *every* slot at once, and its distribute_three check is looser (complete rows
      need only share a multiset, duplicates allowed). Much stricter overall, hence a far
      lower rate; it is what Table A2 reports.
    """
    if definition not in AMBIGUITY_DEFINITIONS:
      raise ValueError(f'definition={definition!r}; allowed: {AMBIGUITY_DEFINITIONS}.')
    valid_BP, other_BPK, _ = self._reading_stats(jnp.asarray(grid), definition == 'authors')
    if definition == 'panel':
      return jnp.any(valid_BP & jnp.any(other_BPK, -1), -1)
    return jnp.any(jnp.all(other_BPK, -1), -1)

  _jit_reading_stats = functools.partial(jax.jit, static_argnums=0)(_reading_stats)

  def consistent_answers(self, grid) -> list[np.ndarray]:
    """Per problem, the answer panels (n_b, K) that some reading predicts (host numpy).

    The union over valid readings (see `is_ambiguous`) of the panels each predicts; the
    true panel is always among them. Only readings that can predict another panel are
    enumerated; the others predict exactly the true panel.
    """
    grid = np.asarray(grid)
    valid, other, possible = map(np.asarray, self._jit_reading_stats(jnp.asarray(grid)))
    slots = np.asarray(self._readings[1])
    result = []
    for b in range(grid.shape[0]):
      truth = tuple(int(v) for v in grid[b, -1, -1])
      panels = {truth}
      readings = np.flatnonzero(valid[b] & other[b].any(-1))
      if readings.size:
        # Possible values per answer slot (n, K, F); many readings share them.
        per_slot = np.zeros((readings.size, self.num_features, self.num_values), bool)
        np.put_along_axis(per_slot, slots[readings][..., None], possible[b, readings], 1)
        for sets in np.unique(per_slot.reshape(readings.size, -1), axis=0):
          sets = sets.reshape(self.num_features, self.num_values)
          panels.update(itertools.product(*(np.flatnonzero(v) for v in sets)))
      result.append(np.array(sorted(panels), dtype=np.int32).reshape(-1, self.num_features))
    return result

  def accuracy_ceiling(self, key: jax.Array, num_problems: int, split: str,
                       batch_size: int = 1024) -> float:
    """Mean over `num_problems` sampled problems of 1 / #consistent answer panels.

    The expected accuracy of a model that cannot tell the readings apart and guesses
    uniformly among their answers. It is not a Bayes bound: readings differ in likelihood
    (two rows of zeros are far likelier under `constant` than under `addition`), so a model
    that learned those likelihoods and the rule prior can score above it.
    """
    def batch_total(grid):
      ambiguous = np.asarray(self.is_ambiguous(grid))
      total = float((~ambiguous).sum())
      if ambiguous.any():
        total += sum(1.0 / len(a) for a in self.consistent_answers(grid[ambiguous]))
      return total

    return self._mean_over_problems(batch_total, key, num_problems, split, batch_size)

  def _mean_over_problems(self, batch_total, key, num_problems, split, batch_size):
    """Mean of a per-problem quantity over `num_problems` sampled problems of `split`.

    `batch_total(grid)` sums the quantity over a host-numpy batch of grids (B, G, G, K).
    """
    self._check_split(split)
    if num_problems < 1:
      raise ValueError(f'num_problems={num_problems}; allowed: >= 1.')
    total, done, step = 0.0, 0, 0
    while done < num_problems:
      grid = self.sample(jax.random.fold_in(key, step), batch_size, split)['grid']
      grid = np.asarray(grid)[:num_problems - done]
      total += batch_total(grid)
      done += grid.shape[0]
      step += 1
    return total / num_problems

  # ------------------------------------------------------------------ Bayes
  def _log_likelihoods(self):
    """log P(a chain's context | rule) when the rule fits it: (R,).

    constant and progressions draw one value per row; addition and subtraction G-1
    operands per row (the last row shows exactly its operands); distribute_three one set
    of G values and one arrangement per row (the last row's known entries fix its own).
    """
    G, F = self.grid_size, self.num_values
    one_per_row = -G * math.log(F)
    operands = -G * (G - 1) * math.log(F)
    distribute = -math.log(math.comb(F, G)) - G * math.log(math.factorial(G))
    return np.array([one_per_row] * 5 + [operands] * 2 + [distribute])

  def bayes_predict(self, grid, split: str, prior: str = 'split') -> tuple[np.ndarray, np.ndarray]:
    """Bayes-optimal answer panels (B, K) and their posterior probability (B,) (host numpy).

    The posterior is that of this split's generative process given the context panels only (the
    answer cell is overwritten before use): a rule multiset uniform over the split's combinations,
    assigned to features in sorted order, uniform per-column permutations (none for `*_unpermuted`
    or `permute_features=False`), and each rule's value distribution (`_log_likelihoods`). Hidden
    states are (reading, rule per chain); one with rule multiset M has prior weight prod_r
    mult_M(r)! (the number of feature labelings it stands for) times the likelihood of its chains.

    prior='split' uses the split's combinations; prior='all' allows all of them (what a
    model that never saw the held-out list could at best assume on `ood`).
    """
    base = self._check_split(split)
    if prior not in ('split', 'all'):
      raise ValueError(f"prior={prior!r}; allowed: ('split', 'all').")
    permuted = self.permute_features and not split.endswith('_unpermuted')
    grid = np.array(grid, dtype=np.int32)
    grid[:, -1, -1] = 0
    fits, answers = map(np.asarray, self._jit_rule_fits(jnp.asarray(grid)))
    chains, slots = self._readings
    if not permuted:  # only the identity reading; reading 0 links slot m to slot m
      chains, slots = chains[:1], slots[:1]
    sources = ('train', 'ood') if prior == 'all' else (base,)
    allowed = {tuple(c) for s in sources for c in self._combinations[s]}
    log_l = self._log_likelihoods()
    valid = fits[:, chains].any(-1).all(-1)  # (B, P)
    panels = np.zeros((grid.shape[0], self.num_features), np.int32)
    probs = np.zeros(grid.shape[0])
    for b in range(grid.shape[0]):
      posterior = collections.defaultdict(float)
      for p in np.flatnonzero(valid[b]):
        options = [np.flatnonzero(fits[b, c]) for c in chains[p]]
        for rules in itertools.product(*options):
          multiset = tuple(sorted(rules))
          if multiset not in allowed or (not permuted and rules != multiset):
            continue
          labelings = math.prod(math.factorial(n) for n in collections.Counter(rules).values())
          panel = [0] * self.num_features
          for m, r in enumerate(rules):
            panel[slots[p, m]] = answers[b, chains[p, m], r]
          posterior[tuple(panel)] += (labelings if permuted else 1) * math.exp(
              sum(log_l[r] for r in rules))
      best = max(posterior, key=posterior.get)
      panels[b], probs[b] = best, posterior[best] / sum(posterior.values())
    return panels, probs

  def bayes_accuracy(self, key: jax.Array, num_problems: int, split: str,
                     prior: str = 'split', batch_size: int = 1024) -> float:
    """Expected accuracy of the Bayes-optimal predictor: mean max posterior probability."""
    return self._mean_over_problems(
        lambda grid: float(self.bayes_predict(grid, split, prior)[1].sum()),
        key, num_problems, split, batch_size)

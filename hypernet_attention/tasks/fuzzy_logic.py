"""Fuzzy logic in-context regression (the paper's Fig. 2), as a jittable JAX generator.

Shape letters:
  B batch, N examples per sequence, L variables, K terms per task.

A *term* is a conjunction over all L variables, each plain or negated; there are 2**L of
them, indexed in binary order with variable 0 as the most significant bit (bit 1 = plain,
0 = negated), as in the authors' code. A *task* is a disjunction of K distinct terms,
evaluated with Zadeh semantics (AND = min, OR = max, NOT x = 1 - x) on x ~ U[0,1]^L.

Splits (the last `num_unseen_terms` terms are never used in training; the seeded split of
the known-term combinations is re-drawn until every known term is in some training task,
or, with `split_draw='authors'`, drawn exactly as the authors' code draws it, which may
leave known terms out of training: `heldout.authors_split`):
  train         the train tasks (combinations of known terms), fresh samples;
  test          the same train tasks, fresh samples;
  ood           held-out combinations of known terms: the paper's "OOD R^2";
  unseen_terms  combinations made only of never-seen terms (all K unseen), as in the
                authors' code, whose own name for this split is `ood` (and `test` for ours).
The split name is folded into the key, so equal keys give different batches per split."""

from __future__ import annotations

import functools
import itertools

import chex
import jax
import jax.numpy as jnp
import numpy as np

from hypernet_attention.tasks import heldout

SPLITS = ('train', 'test', 'ood', 'unseen_terms')
SPLIT_DRAWS = ('covering', 'authors')
class FuzzyLogic(heldout.SplitTables):
  """Generator of fuzzy-logic regression sequences with compositional splits."""

  splits = SPLITS

  def __init__(self, num_variables: int = 4, num_terms: int = 2, num_examples: int = 16,
               holdout_fraction: float = 0.5, num_unseen_terms: int = 4, seed: int = 0,
               split_draw: str | None = 'covering'):
    if not isinstance(num_variables, int) or num_variables < 1:
      raise ValueError(f'num_variables={num_variables!r}; allowed: an int >= 1.')
    if not isinstance(num_examples, int) or num_examples < 2:
      raise ValueError(f'num_examples={num_examples!r}; allowed: an int >= 2.')
    # None: the configs' default (see SPLIT_DRAWS); an empty string is refused, not read as
    # None (`--config.task.split_draw=` trained `covering` silently).
    split_draw = 'covering' if split_draw is None else split_draw
    if split_draw not in SPLIT_DRAWS:
      raise ValueError(f'split_draw={split_draw!r}; allowed: {SPLIT_DRAWS}.')
    num_all = 2 ** num_variables
    if not isinstance(num_terms, int) or not 1 <= num_terms < num_all:
      raise ValueError(f'num_terms={num_terms!r}; allowed: 1 <= num_terms < {num_all}.')
    if not isinstance(num_unseen_terms, int) or not (
        num_terms <= num_unseen_terms <= num_all - num_terms - 1):
      raise ValueError(
          f'num_unseen_terms={num_unseen_terms!r}; allowed: {num_terms} (= num_terms, so '
          f'`unseen_terms` has a task) to {num_all - num_terms - 1} (so that the known '
          f'terms still form at least two tasks).')
    self.num_variables = num_variables
    self.num_terms = num_terms
    self.num_examples = num_examples
    self.holdout_fraction = holdout_fraction
    self.num_unseen_terms = num_unseen_terms
    self.seed = seed
    self.split_draw = split_draw
    # (2**L, L) in {0, 1}; term t's bit for variable l is (t >> (L-1-l)) & 1.
    self.terms_table = np.array(list(itertools.product([0, 1], repeat=num_variables)),
                                dtype=np.int32)
    num_known = num_all - num_unseen_terms
    known = np.array(list(itertools.combinations(range(num_known), num_terms)), np.int32)
    unseen = np.array(list(itertools.combinations(range(num_known, num_all), num_terms)), np.int32)
    train, ood = heldout.split(known, holdout_fraction, num_known, seed,
                               what='combinations of known terms', authors=split_draw == 'authors')
    self._set_combinations({'train': train, 'test': train, 'ood': ood, 'unseen_terms': unseen})
    self._terms = jnp.asarray(self.terms_table)

  @staticmethod
  def evaluate(terms_BKL: jax.Array, x_BNL: jax.Array) -> jax.Array:
    """Zadeh semantics: y = max_k min_l (x_l if plain else 1 - x_l); (B, N)."""
    literals_BNKL = jnp.where(terms_BKL[:, None] == 1, x_BNL[:, :, None], 1.0 - x_BNL[:, :, None])
    return literals_BNKL.min(-1).max(-1)

  @functools.partial(jax.jit, static_argnums=(0, 2, 3))
  def sample(self, key: jax.Array, batch_size: int, split: str,
             tables=None) -> dict[str, jax.Array]:
    """A batch: x (B, N, L) in [0, 1), y (B, N), terms (B, K, L) in {0, 1} (1 = plain).

    `tables` (default: `split_tables()`): per-split task tables of the same shapes, e.g. a
    population member's own held-out split."""
    B, N, L = batch_size, self.num_examples, self.num_variables
    # One draw of random words: each separate jax.random call costs ~1 s of CPU compile.
    bits = jax.random.bits(jax.random.fold_in(key, SPLITS.index(self._check_split(split))),
                           (B, 1 + N * L), jnp.uint32)
    table = (self._tables if tables is None else tables)[split]
    task = table[(bits[:, 0] % jnp.uint32(table.shape[0])).astype(jnp.int32)]
    terms_BKL = self._terms[task]
    # Uniform floats in [0, 1) from the top 23 bits, as jax.random.uniform makes them.
    mantissa = (bits[:, 1:] >> 9) | jnp.uint32(0x3F800000)
    x_BNL = (jax.lax.bitcast_convert_type(mantissa, jnp.float32) - 1.0).reshape(B, N, L)
    chex.assert_shape(terms_BKL, (B, self.num_terms, L))
    return {'x': x_BNL, 'y': self.evaluate(terms_BKL, x_BNL), 'terms': terms_BKL}

  def encode(self, batch: dict[str, jax.Array]) -> tuple[jax.Array, jax.Array]:
    """Tokens (B, N, L+1) = [x; y] with the query's y zeroed, and the target y[:, -1]."""
    y_BN = batch['y']
    chex.assert_shape(batch['x'], (None, self.num_examples, self.num_variables))
    chex.assert_shape(y_BN, batch['x'].shape[:2])
    chex.assert_type([batch['x'], y_BN], float)
    tokens_BNT = jnp.concatenate([batch['x'], y_BN[..., None]], -1).at[:, -1, -1].set(0.0)
    return tokens_BNT.astype(jnp.float32), y_BN[:, -1].astype(jnp.float32)

  output_dim = 1  # One regression output per token; `metrics` reads the query's.

  def metrics(self, outputs_BT1: jax.Array, batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """Per-sequence (B,) squared error `loss` and `r2` of the prediction at the query."""
    _, target_B = self.encode(batch)
    chex.assert_shape(outputs_BT1, (*target_B.shape, None, 1))
    pred_B = outputs_BT1[:, -1, 0].astype(jnp.float32)
    return {'loss': jnp.square(pred_B - target_B),
            'r2': self.r2_per_sequence(pred_B, batch).astype(jnp.float32)}

  def r2_per_sequence(self, pred: jax.Array, batch: dict[str, jax.Array]) -> jax.Array:
    """(B,) R^2 = 1 - (y_q - pred)^2 / Var(y of that sequence); its mean is the paper's R^2
    (Fig. 2, Table A1).

    The variance is the population variance over all N targets of the sequence, query
    included (the authors' `base_mse`): the MSE of predicting the sequence's mean."""
    y_BN = batch['y']
    pred = jnp.reshape(pred, y_BN.shape[:1])
    return 1.0 - (y_BN[:, -1] - pred) ** 2 / jnp.var(y_BN, axis=-1)

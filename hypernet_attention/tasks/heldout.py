"""The held-out split both tasks share: a seeded permutation, re-drawn until it covers.

A task is a combination of symbols (fuzzy-logic terms, SRAVEN rules); `num_ood` of the combinations
are held out. A split whose training combinations miss a symbol would make the OOD split partly a
test of never-seen symbols, so the seeded permutation is re-drawn (from the same generator) until
every symbol is in some training combination. A seed whose first draw covers keeps it.
`SplitTables` gives both task generators `split_tables()` and `combinations(split)` from it."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

# Re-drawing this many times looks for a covering split; failing that, the configuration
# cannot teach every symbol.
MAX_DRAWS = 1000


class SplitTables:
  """A generator's task tables per split, as `sample` reads them: both tasks' `splits`, their
  combinations and the check of a split name (a `*_unpermuted` split reads its base split's)."""

  def _set_combinations(self, combinations: dict[str, np.ndarray]) -> None:
    self._combinations = combinations
    self._tables = {k: jnp.asarray(v) for k, v in combinations.items()}

  def _check_split(self, split: str) -> str:
    if split not in self.splits:
      raise ValueError(f'Unknown split {split!r}; allowed: {self.splits}.')
    return split.removesuffix('_unpermuted')

  def split_tables(self) -> dict[str, jax.Array]:
    """The split's task tables {base split: (n, K) int32}, as `sample` reads them; their
    shapes depend on the task's sizes only, never on its seed."""
    return dict(self._tables)

  def combinations(self, split: str) -> np.ndarray:
    """The tasks (n, K) of a split (term indices, or sorted rule multisets); `train` and
    `test` share theirs."""
    return self._combinations[self._check_split(split)].copy()


def authors_split(combinations: np.ndarray, num_ood: int,
                  seed: int) -> tuple[np.ndarray, np.ndarray]:
  """(train, ood) rows of `combinations` as the authors' fuzzy-logic generator draws them.

  Their code holds out the first `num_ood` rows of `jax.random.permutation(PRNGKey(seed),
  rows)`, once, with the threefry bits of the jax of 2024 (`jax_threefry_partitionable`
  False, the default before jax 0.5). It does not re-draw, so a split can leave a symbol
  out of training: at 70% held out, seed 2 trains none of its 20 tasks on terms 5 and 6,
  and 21 of the 46 held-out tasks contain one of them. For reproducing the paper's splits
  exactly; the covering split (`split`) is what every other number here uses."""
  key = jax.random.PRNGKey(seed, impl="threefry2x32")
  with jax.threefry_partitionable(False):
    order = np.asarray(jax.random.permutation(key, len(combinations)))
  return combinations[np.sort(order[num_ood:])], combinations[np.sort(order[:num_ood])]


def split(combinations: np.ndarray, holdout_fraction: float, num_symbols: int, seed: int, *,
          what: str, authors: bool = False) -> tuple[np.ndarray, np.ndarray]:
  """(train, ood) rows of `combinations` (n, K), each sorted, `holdout_fraction` of them held
  out: the covering split (or `authors_split`); a ValueError naming the fraction and `what` (the
  rows, in words) when it holds out none or all of them, or no draw covers."""
  if not 0.0 < holdout_fraction < 1.0:
    raise ValueError(f'holdout_fraction={holdout_fraction!r}; allowed: 0 < x < 1.')
  n = len(combinations)
  num_ood = int(math.floor(n * holdout_fraction + 1e-9))
  if num_ood < 1 or num_ood >= n:
    raise ValueError(
        f'holdout_fraction={holdout_fraction} holds out {num_ood} of the {n} {what}; '
        f'allowed: a fraction that holds out between 1 and {n - 1}.')
  if authors:
    return authors_split(combinations, num_ood, seed)
  rng = np.random.default_rng(seed)
  for _ in range(MAX_DRAWS):  # Until the training rows use every symbol in [0, num_symbols).
    order = rng.permutation(n)
    train = combinations[np.sort(order[num_ood:])]
    if len(np.unique(train)) == num_symbols:
      return train, combinations[np.sort(order[:num_ood])]
  raise ValueError(
      f'holdout_fraction={holdout_fraction}: no split holding out {num_ood} of the {n} '
      f'{what} keeps every symbol in a training combination; allowed: a smaller fraction '
      'or longer combinations.')

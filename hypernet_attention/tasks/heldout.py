"""The held-out split both tasks share: a seeded permutation, re-drawn until it covers.

A task is a combination of symbols (fuzzy-logic terms, SRAVEN rules); `num_ood` of the
combinations are held out. A split whose training combinations miss a symbol would make the
OOD split partly a test of never-seen symbols, so the seeded permutation is re-drawn (from the
same generator) until every symbol is in some training combination. A seed whose first draw
covers keeps it.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

# Re-drawing this many times looks for a covering split; failing that, the configuration
# cannot teach every symbol.
MAX_DRAWS = 1000


def covering_split(combinations: np.ndarray, num_ood: int, num_symbols: int,
                   seed: int) -> Optional[tuple[np.ndarray, np.ndarray]]:
  """(train, ood) rows of `combinations` (n, K), each sorted, the training rows using every
  symbol in [0, num_symbols); None if no draw in MAX_DRAWS does."""
  rng = np.random.default_rng(seed)
  for _ in range(MAX_DRAWS):
    order = rng.permutation(len(combinations))
    train = combinations[np.sort(order[num_ood:])]
    if len(np.unique(train)) == num_symbols:
      return train, combinations[np.sort(order[:num_ood])]
  return None

"""SRAVEN's analysis (`sraven.py`, Fig. 3): ambiguous problems, accuracy ceilings, Bayes answers.

`Analysis`, a base of `sraven.SRaven`, reads the generator's sizes, `progression_steps`, split
multisets and `sample`; its rule checker is written from the rules' definitions, not the sampler.
Shape letters as `sraven.py`'s, plus C chains (K**G) and P readings ((K!)**(G-1))."""

from __future__ import annotations

import collections
import functools
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np

AMBIGUITY_DEFINITIONS = ('panel', 'authors')


class Analysis:
  """Ambiguity, accuracy ceiling and Bayes-optimal answers of the problems `sample` draws."""

  @functools.cached_property
  def _readings(self):
    """Readings as chain ids (P, K), and the answer slot of each chain (P, K).

    Built on first use: P = (K!)**(G-1) is 576 at K=4, G=3 but explodes beyond K=5, so
    the ambiguity checker is meant for small K; sampling does not need it.

    A reading links slot m of column 0 with slot p_c[m] of column c, for per-column
    permutations p_1..p_{G-1}; fixing column 0 removes relabelings of the same chains.
    Chain id = sum_c slot_c * K**(G-1-c)."""
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
    for d in self.progression_steps:
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

  def _reading_stats(self, grid_BGGK, authors=False):
    """Per reading: valid (B, P) and per chain `another value possible` (B, P, K)."""
    fits_BCR, answers_BCR = self._rule_fits(grid_BGGK, authors)
    values_F = jnp.arange(self.num_values)
    # The values that some rule fitting the chain's context predicts.
    possible_BCF = jnp.any(fits_BCR[..., None] & (answers_BCR[..., None] == values_F), -2)
    chains_PK, slots_PK = self._readings
    truth_BK = grid_BGGK[:, -1, -1, :]
    truth_BPK = truth_BK[:, slots_PK]
    possible_BPKF = possible_BCF[:, chains_PK]
    other_BPK = jnp.any(possible_BPKF & (values_F != truth_BPK[..., None]), -1)
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
      lower rate; it is what Table A2 reports."""
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
    enumerated; the others predict exactly the true panel."""
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
    that learned those likelihoods and the rule prior can score above it."""
    def batch_total(grid):
      ambiguous = np.asarray(self.is_ambiguous(grid))
      total = float((~ambiguous).sum())
      if ambiguous.any():
        total += sum(1.0 / len(a) for a in self.consistent_answers(grid[ambiguous]))
      return total

    return self._mean_over_problems(batch_total, key, num_problems, split, batch_size)

  def _mean_over_problems(self, batch_total, key, num_problems, split, batch_size):
    """Mean of a per-problem quantity over `num_problems` sampled problems of `split`.

    `batch_total(grid)` sums the quantity over a host-numpy batch of grids (B, G, G, K)."""
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

  def _log_likelihoods(self):
    """log P(a chain's context | rule) when the rule fits it: (R,).

    constant and progressions draw one value per row; addition and subtraction G-1
    operands per row (the last row shows exactly its operands); distribute_three one set
    of G values and one arrangement per row (the last row's known entries fix its own)."""
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
    model that never saw the held-out list could at best assume on `ood`)."""
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

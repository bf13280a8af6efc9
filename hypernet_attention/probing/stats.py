"""Statistics the probes are read against: unit-level label permutations, topographic similarity.

Shape letters: N samples, C code width, T tasks, M meaning width, U label units.

Why our own permutations. The claim is about unseen *tasks*, so every sample of a task
shares its label; the exchangeable units under "the code carries no label information" are
the label units (a task, or a (task, feature) pair in SRAVEN), not samples. Shuffling
samples would break the within-task correlation and give a far too narrow null, and
`sklearn.model_selection.permutation_test_score(groups=...)` shuffles labels *within* each
group, which leaves a label that is constant within a group unchanged. So we shuffle the
label of whole units, within strata (SRAVEN: the feature index, whose prior over rules is
skewed, so a probe that only recognises the feature is not mistaken for rule decoding).

Topographic similarity (Brighton & Kirby, 2006):
  rho = Spearman correlation, over all pairs of tasks (i, j), between
        d_code(i, j)    = cosine distance of the tasks' mean codes (per layer, or all
                          layers concatenated; SRAVEN: the per-feature means concatenated),
        d_meaning(i, j) = Hamming distance of the tasks' meanings (the rule of each
                          feature; the presence vector of the known terms).
  p     = one-sided Mantel permutation p-value: the task labels of the meaning matrix are
          permuted (rows and columns together), (1 + #{rho_perm >= rho}) / (1 + n_perm).
  rho ~ 1: tasks that differ in fewer rules/terms have more similar codes; ~0: no relation.
  Meaning distances take few values (0..K), so a code whose distances are continuous
  cannot reach 1 even if perfectly ordered: `rho_ceiling`, the rho of a code whose
  distances order the pairs exactly as the meanings do with ties broken, is that bound.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from scipy import stats as scipy_stats
from scipy.spatial import distance


def unit_labels(unit_N: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Unique units (U,), each unit's label, and the index of each sample's unit (N,)."""
  units, first, index_N = np.unique(unit_N, return_index=True, return_inverse=True)
  per_unit = labels[first]
  if not np.array_equal(per_unit[index_N], labels):
    raise ValueError("labels differ within a label unit; the unit must determine the label")
  return per_unit, index_N


def permute_units(unit_N: np.ndarray, labels: np.ndarray, stratum_N: np.ndarray,
                  rng: np.random.Generator) -> np.ndarray:
  """`labels` with whole units' labels shuffled among the units of the same stratum."""
  per_unit, index_N = unit_labels(unit_N, labels)
  stratum_U, _ = unit_labels(unit_N, stratum_N)
  shuffled = per_unit.copy()
  for s in np.unique(stratum_U):
    members = np.flatnonzero(stratum_U == s)
    shuffled[members] = per_unit[rng.permutation(members)]
  return shuffled[index_N]


def permutation_p_value(observed: float, null: np.ndarray) -> float:
  """One-sided (1 + #{null >= observed}) / (1 + n): never 0, exact under exchangeability."""
  null = np.asarray(null)
  return float((1 + np.sum(null >= observed - 1e-12)) / (1 + null.size))


def task_means(codes_NC: np.ndarray, task_N: np.ndarray, stratum_N: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray]:
  """Task ids (T,) present in every stratum, and their mean codes (T, strata x C)."""
  strata = np.unique(stratum_N)
  tasks = np.unique(task_N)
  for s in strata:
    tasks = np.intersect1d(tasks, task_N[stratum_N == s])
  means = np.zeros((len(tasks), len(strata), codes_NC.shape[1]))
  for j, s in enumerate(strata):
    in_s = stratum_N == s
    sums = np.zeros((tasks.max() + 1 if len(tasks) else 0, codes_NC.shape[1]))
    counts = np.zeros(len(sums))
    keep = in_s & np.isin(task_N, tasks)
    np.add.at(sums, task_N[keep], codes_NC[keep])
    np.add.at(counts, task_N[keep], 1)
    means[:, j] = sums[tasks] / counts[tasks, None]
  return tasks, means.reshape(len(tasks), -1)


def class_means(x_N: np.ndarray, labels: np.ndarray, num_classes: int
                ) -> tuple[np.ndarray, np.ndarray]:
  """Mean of `x_N` (N, ...) over each class present (R', ...), and their class ids (R',).
  `labels`: class ids (N,), or multi-label (N, R) indicators (a sample in several classes)."""
  member_NR = (labels.astype(bool) if labels.ndim == 2
               else labels[:, None] == np.arange(num_classes))
  present = np.flatnonzero(member_NR.any(0))
  member_NR = member_NR[:, present].astype(np.float64)
  sums = np.tensordot(member_NR, np.asarray(x_N, np.float64), (0, 0))
  return sums / member_NR.sum(0).reshape(-1, *[1] * (np.ndim(x_N) - 1)), present


@dataclasses.dataclass(frozen=True)
class Topographic:
  """Topographic similarity of one code (module docstring for the definition)."""
  rho: float
  p_value: float
  rho_ceiling: float  # the largest rho continuous code distances can reach
  num_tasks: int
  num_permutations: int
  code_distance: np.ndarray  # condensed (T*(T-1)/2,)
  meaning_distance: np.ndarray  # condensed Hamming distances (counts)

  def summary(self) -> dict:
    """The numbers, without the distances."""
    return {k: v for k, v in dataclasses.asdict(self).items() if not isinstance(v, np.ndarray)}


def topographic_similarity(means_TC: np.ndarray, meaning_TM: np.ndarray,
                           num_permutations: int = 999, seed: int = 0) -> Topographic:
  """Spearman(cosine code distance, Hamming meaning distance) with a Mantel p-value."""
  if len(means_TC) < 3:
    raise ValueError(f"topographic similarity needs >= 3 tasks; got {len(means_TC)}")
  code_d = distance.pdist(means_TC, "cosine")
  meaning_d = distance.pdist(meaning_TM, "hamming") * meaning_TM.shape[1]
  if np.ptp(code_d) == 0 or np.ptp(meaning_d) == 0 or not np.all(np.isfinite(code_d)):
    # E.g. an untrained layer whose query tokens are all-zero inputs: every task has the
    # same code, and a correlation is undefined.
    return Topographic(rho=float("nan"), p_value=float("nan"), rho_ceiling=float("nan"),
                       num_tasks=len(means_TC),
                       num_permutations=0, code_distance=code_d, meaning_distance=meaning_d)
  # Spearman = Pearson of ranks; permuting tasks permutes the rank matrix's entries.
  code_r = scipy_stats.rankdata(code_d)
  meaning_RR = distance.squareform(scipy_stats.rankdata(meaning_d))
  rho = float(np.corrcoef(code_r, distance.squareform(meaning_RR, checks=False))[0, 1])
  rng = np.random.default_rng(seed)
  null = np.empty(num_permutations)
  for i in range(num_permutations):
    p = rng.permutation(len(means_TC))
    null[i] = np.corrcoef(code_r, distance.squareform(meaning_RR[p][:, p], checks=False))[0, 1]
  ceiling = np.corrcoef(scipy_stats.rankdata(meaning_d),
                        scipy_stats.rankdata(meaning_d, method="ordinal"))[0, 1]
  return Topographic(rho=rho, p_value=permutation_p_value(rho, null), rho_ceiling=float(ceiling),
                     num_tasks=len(means_TC), num_permutations=num_permutations,
                     code_distance=code_d, meaning_distance=meaning_d)


def cosine_matrix(vectors_RC: np.ndarray, centred: bool) -> np.ndarray:
  """Cosine similarity between rows; `centred` subtracts the mean row first (softmax
  codes are all positive, so uncentred cosines all look high)."""
  v = vectors_RC - vectors_RC.mean(0, keepdims=True) if centred else vectors_RC
  return 1.0 - distance.squareform(distance.pdist(v, "cosine"))

"""Linear probes on latent codes, always read against chance, a permutation null and a control.

Shape letters: N samples, C code width (one layer, or all layers concatenated), T terms.

The probe: `StandardScaler` -> `LogisticRegression` (L2) in one `Pipeline`, its inverse
regularization C chosen from `C_GRID` by cross-validation on the *fitting side only*, with
`StratifiedGroupKFold` over tasks (no task in two folds), so C is picked for generalising
to unseen tasks, the claim being tested. Fit on the in-distribution split, score on the
held-out-task split. Scored against:
  chance      `DummyClassifier` most-frequent and stratified (mean of 20 draws), fit on
              the same fitting side, scored on the same split; SRAVEN also the per-feature prior
              (the most frequent rule of each feature: unpermuted rule tuples are sorted multisets,
              so the feature index alone predicts the rule well above uniform).
  permutation the labels of whole label units shuffled within strata (`stats.py` says
              why), the probe refit on each shuffle and scored on the true held-out
              labels; p = (1 + #{null >= real}) / (1 + n). The null probes reuse the C the
              real probe chose: re-running the grid search per shuffle costs ~30x more; C is
              chosen on the fitting side, never on the held-out score.
  control     Hewitt & Liang (2019): a fixed random map from label unit to a label (the
              real unit labels shuffled within strata, so the label distribution is the real one),
              same probe; both probes on one 50/50 *sample-level* split of the in-distribution
              samples (a control label can only be memorised per unit, so it must be scored on units
              seen in fitting); both with the C the real decoder chose (one probe, as Hewitt & Liang
              fix the probe's hyperparameters). Selectivity = real - control accuracy on that split:
              how much of the probe's success is more than memorising units.
Multi-label (fuzzy logic): one binary probe per known term, the same machinery per term with F1 as
the score and `class_weight='balanced'` (a term is in 1/6 of the tasks: an unweighted probe at
threshold 0.5 measured F1 0.01-0.05 on the size=local runs by predicting "absent" almost everywhere,
which says nothing about the code); macro-F1 over the terms that at least two fitting tasks contain
and two do not (others cannot be cross-validated and are reported as skipped).
"""

from __future__ import annotations

import dataclasses
from typing import Optional
import warnings

import numpy as np
from sklearn import dummy
from sklearn import linear_model
from sklearn import metrics
from sklearn import model_selection
from sklearn import pipeline
from sklearn import preprocessing

from hypernet_attention.probing import stats

C_GRID = np.logspace(-3, 1, 5)
MAX_FOLDS = 5
STRATIFIED_DRAWS = 20


@dataclasses.dataclass(frozen=True)
class Side:
  """The samples of one side of a probe: codes, labels and their units."""
  x_NC: np.ndarray
  y: np.ndarray
  task_N: np.ndarray
  unit_N: np.ndarray
  stratum_N: np.ndarray

  def take(self, index) -> "Side":
    return Side(*(a[index] for a in dataclasses.astuple(self)))


def make_probe(c: float = 1.0, balanced: bool = False) -> pipeline.Pipeline:
  return pipeline.make_pipeline(preprocessing.StandardScaler(), linear_model.LogisticRegression(
      C=c, max_iter=2000, class_weight="balanced" if balanced else None))


def cv_splits(side: Side, seed: int, grouped: bool = True) -> list:
  """Stratified k-fold splits of `side`; `grouped`: no task on both sides of any fold."""
  groups = side.task_N if grouped else np.arange(len(side.y))
  per_class = [len(np.unique(groups[side.y == c])) for c in np.unique(side.y)]
  # Binary: every fold must hold both classes (F1 needs positives); multiclass: rare
  # rules may sit in one fold only, as they sit in few tasks.
  folds = min(MAX_FOLDS, min(per_class) if len(per_class) == 2 else len(np.unique(groups)))
  if folds < 2 or len(per_class) < 2:
    raise ValueError(f"too few tasks per class on the fitting side to cross-validate "
                     f"(tasks per class: {per_class})")
  cv = (model_selection.StratifiedGroupKFold(folds, shuffle=True, random_state=seed) if grouped
        else model_selection.StratifiedKFold(folds, shuffle=True, random_state=seed))
  with warnings.catch_warnings():  # "least populated class has only k members": expected.
    warnings.simplefilter("ignore", UserWarning)
    return list(cv.split(side.x_NC, side.y, groups))


def fit_probe(side: Side, scoring: str, seed: int, grouped: bool = True, balanced: bool = False):
  """The probe fit on `side` with C chosen by (grouped) stratified k-fold CV: (probe, C)."""
  search = model_selection.GridSearchCV(
      make_probe(balanced=balanced), {"logisticregression__C": C_GRID},
      cv=cv_splits(side, seed, grouped), scoring=scoring)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", UserWarning)
    search.fit(side.x_NC, side.y)
  return search.best_estimator_, float(search.best_params_["logisticregression__C"])


def _refit(c: float, side: Side, y: np.ndarray, balanced: bool = False):
  return make_probe(c, balanced).fit(side.x_NC, y)


# ------------------------------------------------------------------ multiclass (SRAVEN)
def multiclass_scores(y_true: np.ndarray, y_pred: np.ndarray) -> dict[str, float]:
  """Accuracy, balanced accuracy and macro-F1, the latter two over the classes present in
  `y_true` (a rule absent from the held-out tasks has no recall to average)."""
  present = np.unique(y_true)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", UserWarning)
    return dict(
        accuracy=float(metrics.accuracy_score(y_true, y_pred)),
        balanced_accuracy=float(metrics.balanced_accuracy_score(y_true, y_pred)),
        macro_f1=float(metrics.f1_score(y_true, y_pred, labels=present, average="macro",
                                        zero_division=0)))


def chance_multiclass(fit: Side, score: Side, seed: int) -> dict[str, dict[str, float]]:
  out = {"most_frequent": multiclass_scores(
      score.y, dummy.DummyClassifier(strategy="most_frequent").fit(fit.x_NC, fit.y)
      .predict(score.x_NC))}
  draws = [multiclass_scores(score.y, dummy.DummyClassifier(
      strategy="stratified", random_state=seed + i).fit(fit.x_NC, fit.y).predict(score.x_NC))
           for i in range(STRATIFIED_DRAWS)]
  out["stratified"] = {k: float(np.mean([d[k] for d in draws])) for k in draws[0]}
  if len(np.unique(fit.stratum_N)) > 1:
    prior = {s: np.bincount(fit.y[fit.stratum_N == s]).argmax() for s in np.unique(fit.stratum_N)}
    default = np.bincount(fit.y).argmax()
    pred = np.array([prior.get(s, default) for s in score.stratum_N])
    out["feature_prior"] = multiclass_scores(score.y, pred)
  return out


@dataclasses.dataclass(frozen=True)
class MulticlassResult:
  scores: dict[str, float]
  chance: dict[str, dict[str, float]]
  confusion: np.ndarray  # (classes, classes), rows = true rule, over all classes
  c: float
  p_value: dict[str, float]  # per score, from the unit-level permutation null
  null_mean: dict[str, float]
  num_permutations: int

  def summary(self) -> dict:
    d = dataclasses.asdict(self)
    d["confusion"] = self.confusion.tolist()
    return d


def decode_multiclass(fit: Side, score: Side, num_classes: int, num_permutations: int,
                      seed: int = 0) -> MulticlassResult:
  """Fit on `fit`, score on `score` (held-out tasks), with chance and a permutation p-value."""
  probe, c = fit_probe(fit, "balanced_accuracy", seed)
  pred = probe.predict(score.x_NC)
  scores = multiclass_scores(score.y, pred)
  rng = np.random.default_rng(seed)
  nulls = {k: [] for k in scores}
  for _ in range(num_permutations):
    y_perm = stats.permute_units(fit.unit_N, fit.y, fit.stratum_N, rng)
    for k, v in multiclass_scores(score.y, _refit(c, fit, y_perm).predict(score.x_NC)).items():
      nulls[k].append(v)
  return MulticlassResult(
      scores=scores, chance=chance_multiclass(fit, score, seed),
      confusion=metrics.confusion_matrix(score.y, pred, labels=np.arange(num_classes)),
      c=c, p_value={k: stats.permutation_p_value(v, nulls[k]) for k, v in scores.items()},
      null_mean={k: float(np.mean(nulls[k])) if nulls[k] else float("nan") for k in scores},
      num_permutations=num_permutations)


def _control(side: Side, seed: int):
  """Control labels (a fixed random unit -> label map) and a 50/50 sample-level split."""
  control_y = stats.permute_units(side.unit_N, side.y, side.stratum_N, np.random.default_rng(seed))
  first, second = model_selection.train_test_split(
      np.arange(len(side.y)), test_size=0.5, random_state=seed)
  return control_y, first, second


def selectivity(side: Side, c: float, seed: int = 0) -> dict[str, float]:
  """Real vs control-task accuracy of the probe with inverse regularization `c` (the real
  decoder's) on one sample-level split of `side` (module docstring)."""
  control_y, first, second = _control(side, seed)
  out = {}
  for name, y in (("real", side.y), ("control", control_y)):
    probe = _refit(c, side.take(first), y[first])
    out[name] = float(metrics.accuracy_score(y[second], probe.predict(side.x_NC[second])))
  out["selectivity"] = out["real"] - out["control"]
  return out


# ---------------------------------------------------------------- multi-label (fuzzy)
def _f1(y_true, y_pred) -> float:
  return float(metrics.f1_score(y_true, y_pred, zero_division=0))


@dataclasses.dataclass(frozen=True)
class MultilabelResult:
  per_term_f1: list[Optional[float]]  # None: term skipped (too few fitting tasks)
  macro_f1: float
  chance: dict[str, float]  # macro-F1 of each dummy over the same terms
  c: list[Optional[float]]
  p_value: float
  null_mean: float
  num_permutations: int
  skipped_terms: list[int]

  def summary(self) -> dict:
    return dataclasses.asdict(self)


def _decodable(fit: Side, t: int) -> bool:
  tasks_with = np.unique(fit.task_N[fit.y[:, t] == 1])
  tasks_without = np.unique(fit.task_N[fit.y[:, t] == 0])
  return len(tasks_with) >= 2 and len(tasks_without) >= 2


def decode_multilabel(fit: Side, score: Side, num_permutations: int, seed: int = 0
                      ) -> MultilabelResult:
  """One probe per term (fit side -> held-out tasks); macro-F1, chance, permutation p-value."""
  terms = [t for t in range(fit.y.shape[1]) if _decodable(fit, t)]
  if not terms:
    raise ValueError("no term is contained in >= 2 and missing from >= 2 fitting tasks")
  f1, cs = [None] * fit.y.shape[1], [None] * fit.y.shape[1]
  for t in terms:
    probe, cs[t] = fit_probe(dataclasses.replace(fit, y=fit.y[:, t]), "f1", seed, balanced=True)
    f1[t] = _f1(score.y[:, t], probe.predict(score.x_NC))
  macro = float(np.mean([f1[t] for t in terms]))
  dummies = {"most_frequent": [dict(strategy="most_frequent")],
             "always_positive": [dict(strategy="constant", constant=1)],
             "stratified": [dict(strategy="stratified", random_state=seed + i)
                            for i in range(STRATIFIED_DRAWS)]}
  chance = {}
  for name, settings in dummies.items():  # The mean over terms (and stratified draws).
    f1s = [_f1(score.y[:, t], dummy.DummyClassifier(**kw).fit(fit.x_NC, fit.y[:, t])
               .predict(score.x_NC)) for t in terms for kw in settings]
    chance[name] = float(np.mean(f1s))
  rng = np.random.default_rng(seed)
  null = []
  for _ in range(num_permutations):
    y_perm = stats.permute_units(fit.unit_N, fit.y, fit.stratum_N, rng)
    null.append(np.mean([
        _f1(score.y[:, t], _refit(cs[t], fit, y_perm[:, t], True).predict(score.x_NC))
        for t in terms]))
  return MultilabelResult(
      per_term_f1=f1, macro_f1=macro, chance=chance, c=cs,
      p_value=stats.permutation_p_value(macro, null),
      null_mean=float(np.mean(null)) if null else float("nan"),
      num_permutations=num_permutations,
      skipped_terms=[t for t in range(fit.y.shape[1]) if t not in terms])


def selectivity_multilabel(side: Side, cs: list, seed: int = 0) -> dict[str, float]:
  """Per-term control task (whole presence vectors re-assigned per task), mean accuracy over
  the decoded terms (`cs`: each term's C, None = skipped) with both classes in the half."""
  control_y, first, second = _control(side, seed)
  out = {}
  for name, y in (("real", side.y), ("control", control_y)):
    accs = [metrics.accuracy_score(y[second, t], _refit(c, side.take(first), y[first, t], True)
                                   .predict(side.x_NC[second]))
            for t, c in enumerate(cs) if c is not None and len(np.unique(y[first, t])) == 2]
    out[name] = float(np.mean(accs)) if accs else float("nan")
  out["selectivity"] = out["real"] - out["control"]
  return out


def ridge_r2(x_NC: np.ndarray, y_NT: np.ndarray) -> float:
  """The authors' logged `r2_attn_latent`: ridge (alpha 1, intercept) from codes to the term
  matrix, first half of the samples to fit, second half to score, mean R^2 over terms.
  Both halves come from the same (training) tasks: it does not test held-out tasks."""
  half = len(x_NC) // 2
  model = linear_model.Ridge(alpha=1.0).fit(x_NC[:half], y_NT[:half])
  return float(metrics.r2_score(y_NT[half:], model.predict(x_NC[half:])))

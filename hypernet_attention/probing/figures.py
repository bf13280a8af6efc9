"""Figures of a probe (PNG, matplotlib, Agg): each readable without the report's text.

Shape letters: N samples, C code width, R classes (rules / terms), T tasks.

  decoder_vs_layer   held-out-task decoding score per layer, with chance and step-0 lines
                     (the paper's Fig. 5F / 2B), one column per run;
  embeddings         PCA and t-SNE of the codes per layer coloured by class (Fig. 5B / A6);
  class_cosines      class x class cosine similarity of mean codes per layer, uncentred and
                     centred, on a fixed [-1, 1] scale (Fig. 5E / A8);
  topographic        code distance vs meaning distance over pairs of tasks, with rho and p;
  generated_cosines  the same class x class cosines for the generated value networks.
"""

from __future__ import annotations

import io
from typing import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position
from sklearn import decomposition  # pylint: disable=g-import-not-at-top,wrong-import-position
from sklearn import manifold  # pylint: disable=g-import-not-at-top,wrong-import-position

from hypernet_attention.probing import stats  # pylint: disable=wrong-import-position
from hypernet_attention.runs import run_files  # pylint: disable=wrong-import-position

DPI = 80


def _save(fig, path: str, tight: bool = True) -> None:
  """Writes the PNG through `workdir.py` (local or gs://) and closes the figure."""
  if tight:
    fig.tight_layout()
  png = io.BytesIO()
  fig.savefig(png, format="png", dpi=DPI)
  plt.close(fig)
  run_files.write_bytes(path, png.getvalue())


def decoder_vs_layer(runs: Sequence[dict], path: str) -> None:
  """`runs`: [{name, feature_sets, scores: {metric: {trained, step0, chance: {name: [...]}}}}]."""
  metrics = list(dict.fromkeys(m for run in runs for m in run["scores"]))
  fig, axes = plt.subplots(len(metrics), len(runs), figsize=(3.6 * len(runs), 2.9 * len(metrics)),
                           squeeze=False)
  styles = {"most_frequent": ":", "stratified": "--", "feature_prior": "-.",
            "always_positive": (0, (1, 3))}
  for j, run in enumerate(runs):
    x = np.arange(len(run["feature_sets"]))
    for i, metric in enumerate(metrics):
      ax, lines = axes[i, j], run["scores"].get(metric)
      if lines is None:  # runs of another experiment kind: another score
        ax.set_axis_off()
        continue
      ax.plot(x, lines["trained"], "o-", color="C0", label="trained")
      ax.plot(x, lines["step0"], "s-", color="C1", label="step 0 (untrained)")
      for name, values in lines["chance"].items():
        ax.plot(x, values, linestyle=styles.get(name, "--"), color="gray", label=f"chance: {name}")
      ax.set_xticks(x, run["feature_sets"], rotation=20)
      ax.set_ylim(0, 1)
      ax.set_title(run["name"], fontsize=9)
      if j == 0:
        ax.set_ylabel(f"{metric}\n(held-out tasks)")
      ax.grid(alpha=0.3)
  axes[0, -1].legend(fontsize=7, loc="best")
  _save(fig, path)


def _layers(codes) -> list[str]:
  return [f"layer {l}" for l in range(codes.codes_NLC.shape[1])]


def embeddings(codes, path: str, max_points: int = 600, seed: int = 0) -> None:
  rng = np.random.default_rng(seed)
  keep = rng.permutation(len(codes.task_N))[:max_points]
  # One colour class per sample: the rule, or for multi-label codes the first term.
  colour = codes.labels.argmax(1) if codes.multilabel else codes.labels
  names = codes.class_names
  layers = _layers(codes)
  fig, axes = plt.subplots(2, len(layers), figsize=(3.6 * len(layers), 6.4), squeeze=False)
  cmap = plt.get_cmap("tab10" if len(names) <= 10 else "tab20")
  for l, title in enumerate(layers):
    x = codes.codes_NLC[keep, l]
    if np.ptp(x, axis=0).max() == 0:
      # One code for every sample (layer 0's self-code at a fixed fuzzy-logic query under
      # HYLA or linear attention): nothing to embed, and t-SNE segfaults on it.
      for row, method in enumerate(("PCA", "t-SNE")):
        axes[row, l].text(0.5, 0.5, "constant code", ha="center", va="center")
        axes[row, l].set_title(f"{method}, {title}", fontsize=9)
        axes[row, l].set_xticks([]), axes[row, l].set_yticks([])
      continue
    x = (x - x.mean(0)) / np.maximum(x.std(0), 1e-12)
    pca = decomposition.PCA(2, random_state=seed).fit_transform(x)
    tsne = manifold.TSNE(2, perplexity=min(30, len(keep) - 1), init="pca", max_iter=500,
                         random_state=seed).fit_transform(x)
    for row, (emb, method) in enumerate(((pca, "PCA"), (tsne, "t-SNE"))):
      ax = axes[row, l]
      for c in np.unique(colour[keep]):
        sel = colour[keep] == c
        ax.scatter(emb[sel, 0], emb[sel, 1], s=4, color=cmap(c % cmap.N), label=names[c])
      ax.set_title(f"{method}, {title}", fontsize=9)
      ax.set_xticks([]), ax.set_yticks([])
  axes[0, -1].legend(fontsize=6, markerscale=2, loc="best")
  fig.suptitle(f"latent codes coloured by {'first term' if codes.multilabel else 'rule'} "
               f"(step {codes.step}, {len(keep)} samples, both splits)", fontsize=10)
  _save(fig, path)


def _matrix(ax, m_RR, names, title):
  im = ax.imshow(m_RR, vmin=-1, vmax=1, cmap="RdBu_r")
  ax.set_xticks(range(len(names)), names, rotation=90, fontsize=6)
  ax.set_yticks(range(len(names)), names, fontsize=6)
  ax.set_title(title, fontsize=9)
  return im


def class_cosines(codes, path: str) -> None:
  layers = _layers(codes)
  fig, axes = plt.subplots(2, len(layers), figsize=(3.8 * len(layers) + 1, 7.4), squeeze=False,
                           layout="constrained")
  for l, title in enumerate(layers):
    means, present = stats.class_means(codes.codes_NLC[:, l], codes.labels, len(codes.class_names))
    for row, centred in enumerate((False, True)):
      im = _matrix(axes[row, l], stats.cosine_matrix(means, centred), codes.class_names[present],
                   f"{title}, {'centred' if centred else 'uncentred'}")
  fig.colorbar(im, ax=axes, shrink=0.6, label="cosine similarity of mean codes")
  _save(fig, path, tight=False)  # The layout is "constrained".


def topographic(results: dict, path: str, seed: int = 0) -> None:
  """`results`: {feature set: stats.Topographic}."""
  rng = np.random.default_rng(seed)
  fig, axes = plt.subplots(1, len(results), figsize=(3.4 * len(results), 3.0), squeeze=False)
  for ax, (name, topo) in zip(axes[0], results.items()):
    jitter = rng.uniform(-0.15, 0.15, topo.meaning_distance.shape)
    ax.scatter(topo.meaning_distance + jitter, topo.code_distance, s=2, alpha=0.3)
    ax.set_xlabel("meaning distance (Hamming)")
    ax.set_ylabel("code distance (cosine)")
    ax.set_title(f"{name}: rho={topo.rho:.2f}, p={topo.p_value:.3g}", fontsize=9)
  _save(fig, path)


def generated_cosines(weights: Sequence, class_names: np.ndarray, path: str) -> None:
  fig, axes = plt.subplots(1, len(weights), figsize=(3.8 * len(weights) + 1, 3.9), squeeze=False,
                           layout="constrained")
  for ax, w in zip(axes[0], weights):
    im = _matrix(ax, w.cosine_centred, class_names[w.classes], f"{w.layer} {w.matrix}, centred")
  fig.colorbar(im, ax=axes, shrink=0.7, label="cosine of mean generated weights")
  _save(fig, path, tight=False)  # The layout is "constrained".

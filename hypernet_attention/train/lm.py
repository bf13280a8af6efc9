"""The language-modeling entry point's library: prepare data, train, sample.

`experiments/c4_lm.py` only parses flags and calls `train_and_sample` or
`sample_from_workdir`.
"""

from __future__ import annotations

from typing import Any, Optional

import ml_collections

from hypernet_attention import decoding
from hypernet_attention.train import console

console.import_tensorflow_quietly()  # Before seqio and c4 load TensorFlow, which logs natively.
# pylint: disable=g-import-not-at-top,wrong-import-position
from hypernet_attention.tasks import c4
from hypernet_attention.train import build
from hypernet_attention.train import loop
from hypernet_attention.train import restore


def _vocabulary(objective) -> Any:
  return objective.task.output_features["targets"].vocabulary


def _format(texts: list[str]) -> str:
  return "\n".join(f"sample {i}: {text}" for i, text in enumerate(texts))


def train_and_sample(config: ml_collections.ConfigDict, workdir: str, *, prompt: str,
                     num_tokens: int, temperature: float, num_samples: int = 2) -> dict:
  """Resolves the data (corpus, vocabulary) into `workdir`, trains, prints samples."""
  config = c4.prepare_config(config, workdir)
  summary = loop.train_and_evaluate(config, workdir)
  built = build.setup(config)
  texts = decoding.sample_text(
      built.model.config, summary["state"].params, _vocabulary(built.objective), prompt,
      num_tokens, temperature=temperature, seed=config.seed, num_samples=num_samples)
  print(_format(texts), flush=True)
  return summary


def sample_from_workdir(workdir: str, *, prompt: str, num_tokens: int, temperature: float,
                        step: Optional[int] = None, num_samples: int = 2) -> str:
  """Samples from checkpoint `step` (default: the newest) of the run in `workdir`."""
  run = restore.restore_params(workdir, step)
  texts = decoding.sample_text(
      run.model.config, run.params, _vocabulary(run.objective), prompt, num_tokens,
      temperature=temperature, seed=run.config.seed, num_samples=num_samples)
  return f"step {run.step} of {workdir}\n" + _format(texts)

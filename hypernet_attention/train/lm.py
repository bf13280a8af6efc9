"""The language-modeling entry point's library: prepare data, train, sample.

`experiments/c4_lm.py` only parses flags and calls `train_and_sample` or
`sample_from_workdir`. The text comes through `config.task.pipeline` (`tasks/lm_text.py`):
seqio (TensorFlow, loaded only then) or Grain (no TensorFlow)."""

from __future__ import annotations

from typing import Any, Optional

import ml_collections

from hypernet_attention import decoding
from hypernet_attention import errors
from hypernet_attention.runs import cli
from hypernet_attention.runs import config_checks
from hypernet_attention.runs import registry
from hypernet_attention.runs import run_files
from hypernet_attention.tasks import lm_text
from hypernet_attention.train import build
from hypernet_attention.train import data
from hypernet_attention.train import loop
from hypernet_attention.train import objectives
from hypernet_attention.train import restore
from hypernet_attention.train import sharding


def _vocabulary(config: ml_collections.ConfigDict, objective) -> Any:
  return objectives.lm_pipeline(config.task).task_vocabulary(objective.task)


def _format(texts: list[str]) -> str:
  return "\n".join(f"sample {i}: {text}" for i, text in enumerate(texts))


def check_before_data(config: ml_collections.ConfigDict, workdir: str) -> str:
  """What can be refused before the corpus and vocabulary are written into `workdir`, past
  `config_checks.validate`: the task, the row length, the mesh, a workdir holding another
  experiment's run. Returns the workdir as the run uses it (`~` expanded)."""
  if config.task.name == objectives.SYNTHETIC_LM:
    raise errors.BadInput(
        f"config.task.name={objectives.SYNTHETIC_LM!r} is random tokens for "
        f"experiments/benchmark_training.py only (nothing to learn, no text to sample); "
        f"allowed for training: {', '.join(lm_text.TASKS)}")
  lm_text.check_pipeline(config.task)
  workdir = run_files.workdir_path(workdir)
  length = config.task.sequence_length
  if isinstance(length, bool) or not isinstance(length, int) or length < 2:
    raise errors.BadInput(f"config.task.sequence_length={length!r}; allowed: an integer "
                              ">= 2 (one input and one target token)")
  lm_text.check_sequence_length(length, config.model.get("max_len"))
  with build.as_bad_input():
    mesh = sharding.make_mesh(config.mesh)
    for key, size in (("batch_size", config.batch_size),
                      ("eval.batch_size", config.eval.batch_size)):
      sharding.check_batch_size(size, mesh, key)
      data.local_batch_size(size, key)
  root = run_files.path(workdir)
  if root.exists() and not root.is_dir():
    raise errors.BadInput(f"--workdir={workdir!r} is a file, not a directory")
  recorded = run_files.read_config(workdir)
  if recorded is not None and recorded.get("experiment") != config.experiment:
    raise errors.BadInput(
        f"workdir {workdir!r} holds a different experiment ({recorded.get('experiment')!r}, "
        f"not {config.experiment!r}); nothing was written: use a fresh --workdir")
  return workdir


# What a run prints when it ends (`experiments/c4_lm.py`'s flags default to it).
SAMPLING = dict(prompt="The", num_tokens=64, temperature=0.8)


def train(config: ml_collections.ConfigDict | config_checks.Checked, workdir: str) -> dict:
  """`train_and_sample` with the default `SAMPLING`: the record's trainer, what
  `experiments/train.py` runs for a language-model config."""
  return train_and_sample(config, workdir, **SAMPLING)


def train_and_sample(config: ml_collections.ConfigDict | config_checks.Checked, workdir: str,
                     *, prompt: str, num_tokens: int, temperature: float,
                     num_samples: int = 2) -> dict:
  """Checks what it can (the config once: `config_checks.validate`, unless the entry did),
  resolves the data (corpus, vocabulary) into `workdir`, trains, prints samples."""
  checked = config_checks.validate(config)
  config = checked.config
  workdir = check_before_data(config, workdir)
  cli.announce_workdir(workdir)  # The data written next: a stop from here names it.
  decoding.check_sampling(prompt=prompt, num_tokens=num_tokens, temperature=temperature)
  pipeline = objectives.lm_pipeline(config.task)
  # Resolving the data changes only `config.task`'s files, which `validate` does not read.
  checked = checked._replace(config=lm_text.prepare_config(config, workdir, pipeline.resolve))
  config = checked.config
  vocabulary = pipeline.load_vocabulary(config.task.vocabulary)  # The prompt fits: before training.
  decoding.check_prompt_length(1 + len(vocabulary.encode(prompt)), config.model.get("max_len"))
  summary = loop.train_and_evaluate(checked, workdir)
  built = build.setup(checked)
  texts = decoding.sample_text(
      built.model.config, summary["state"].params, _vocabulary(config, built.objective), prompt,
      num_tokens, temperature=temperature, seed=config.seed, num_samples=num_samples)
  print(_format(texts), flush=True)
  return summary


def sample_from_workdir(workdir: str, *, prompt: str, num_tokens: int, temperature: float,
                        step: Optional[int] = None, num_samples: int = 2) -> str:
  """Samples from checkpoint `step` (default: the newest) of the run in `workdir`."""
  with build.as_bad_input():
    experiment = restore.load_config(workdir).experiment
  language_models = registry.names(train=f"{__name__}:train")  # Records trained here.
  if experiment not in language_models:
    raise errors.BadInput(f"--workdir={workdir!r} holds a {experiment!r} run; allowed: the "
                          f"workdir of a language-modeling ({', '.join(language_models)}) run")
  decoding.check_sampling(prompt=prompt, num_tokens=num_tokens, temperature=temperature)
  run = restore.restore_params(workdir, step)
  texts = decoding.sample_text(
      run.model.config, run.params, _vocabulary(run.config, run.objective), prompt,
      num_tokens, temperature=temperature, seed=run.config.seed, num_samples=num_samples)
  return f"step {run.step} of {workdir}\n" + _format(texts)

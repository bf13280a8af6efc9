"""What every `experiments/configs/*.py` shares (big_vision's `configs/common.py`): the
fields of every config (`base_config`), the synthetic tasks' model (`model_config`), the
smoke schedule, and `parse_arg` for `get_config(arg)` strings.

`get_config("model=hyla,size=local")` style arguments follow big_vision: comma-separated
`key=value` pairs with defaults; an unknown key or value is a `ValueError` that lists what
is allowed, raised before anything runs."""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

import ml_collections

from hypernet_attention.runs import config_checks


def parse_arg(arg: Optional[str], allowed: Mapping[str, Sequence[Any]] | None = None,
              **defaults: Any) -> ml_collections.ConfigDict:
  """Parses `"k1=v1,k2=v2"` into a ConfigDict, typed like `defaults`.

  Args:
    arg: the string after the colon in `--config=path.py:arg` (None or '' for defaults).
    allowed: optional `key -> allowed values`; other values raise.
    **defaults: every accepted key with its default (the type of the default is used
      to convert the string)."""
  result = dict(defaults)
  for item in (arg or "").split(","):
    item = item.strip()
    if not item:
      continue
    if "=" not in item:
      raise ValueError(f"config argument {item!r} is not key=value; keys: {sorted(defaults)}")
    key, value = (s.strip() for s in item.split("=", 1))
    if key not in defaults:
      raise ValueError(f"unknown config argument {key!r}; allowed: {sorted(defaults)}")
    kind = type(defaults[key])
    try:
      result[key] = value if kind is str else kind(value)
    except ValueError as e:
      raise ValueError(f"config argument {key}={value!r} is not a {kind.__name__}") from e
  for key, values in (allowed or {}).items():
    if result[key] not in values:
      raise ValueError(
          f"config argument {key}={result[key]!r} is not allowed; choose from {list(values)}")
  return ml_collections.ConfigDict(result)


def model_config(attention: str, **sizes: Any) -> ml_collections.ConfigDict:
  """`config.model` of the synthetic tasks: the paper's fixed choices, plus `sizes`.

  Fixed as in the authors' code (the paper's appendix): GeLU MLP, T5 relative bias with
  `bidirectional=False`, non-causal, dropout 0.1 on the latent code, float32."""
  config_checks.check_preset(attention)
  model = ml_collections.ConfigDict(dict(
      attention=attention, feed_forward="gelu_mlp", position="t5", bidirectional=False,
      causal=False, attention_dropout=0.1, dtype="float32", implementation="auto",
      # Overrides the preset's value-network activation (the rebuttal's phi sweep).
      activation=ml_collections.config_dict.placeholder(str),
      num_experts=5, top_k=2))  # Used only with feed_forward="moe" (Table A1's MoE rows).
  model.update(sizes)
  return model


def follow_run_seed() -> ml_collections.FieldReference:
  """The default of `task.split_seed`: None, meaning "the run's `seed`".

  The paper re-draws the held-out split with each run's seed (the authors' SRAVEN held-out
  sets for seeds 0 and 1 share 13 of 82 combinations), so its error bars over seeds include
  split variance; None does the same. An int fixes the split across seeds (then the spread
  over seeds is initialization and data order only). `objectives.split_seed` resolves it."""
  return ml_collections.config_dict.placeholder(int)


def use_smoke_schedule(c: ml_collections.ConfigDict) -> None:
  """The loop settings every `size=smoke` config shares: 8 steps at batch 16, logged,
  evaluated and checkpointed every 4, on 32 eval problems. Seconds on a CPU; tests use it."""
  c.update(batch_size=16, num_train_steps=8, steps_per_loop=4, log_every_steps=4,
           eval_every_steps=4, checkpoint_every_steps=4)
  c.optimizer.update(warmup_steps=2)
  c.eval.update(num_problems=32, batch_size=16)


def base_config(*, experiment: str, seed: int = 0) -> ml_collections.ConfigDict:
  """Fields every experiment config has; the experiment file fills in the values."""
  c = ml_collections.ConfigDict()
  c.experiment = experiment
  c.seed = seed  # Initialization, training data order and dropout.
  c.task = ml_collections.ConfigDict()
  c.model = ml_collections.ConfigDict()
  c.batch_size = 128
  c.num_train_steps = 1000
  # Optimizer steps per host call (one jitted lax.scan); intervals below need not divide it.
  c.steps_per_loop = 50
  c.log_every_steps = 500
  c.eval_every_steps = 5000
  c.checkpoint_every_steps = 5000
  c.keep_checkpoints = 3
  c.async_checkpoints = True
  # Seconds between a preemption notice (SIGTERM) and the hard kill on the target platform
  # (~30 s on GCE spot VMs and Kubernetes; SLURM: the cluster's KillWait / --signal lead).
  # A chunk is kept under half of it, leaving the rest for the save (`preemption.py`);
  # 0: chunks of `steps_per_loop` however long they take.
  c.preemption_grace_s = 30.0
  # Test hook: stop this invocation at this step (as if killed); rerun to resume.
  c.stop_after_steps = ml_collections.config_dict.placeholder(int)
  # jax_debug_nans for this run: stop at the first op that makes a NaN (slow; for hunting).
  c.debug_nans = False
  c.optimizer = ml_collections.ConfigDict(dict(
      learning_rate=1e-3, warmup_steps=1000, end_lr_fraction=0.1, weight_decay=0.1,
      b1=0.9, b2=0.999, eps=1e-8, grad_clip_norm=0.0,  # 0: no clipping.
      # True: the authors' decay_steps = steps - warmup (floor reached warmup steps early).
      authors_schedule=False))
  # Members trained together as one vmapped program (`train/population.py`): a tuple of
  # dicts over `run_files.MEMBER_KEYS`; empty = a single run.
  c.population = ml_collections.ConfigDict(dict(members=(), member_names=()))
  c.eval = ml_collections.ConfigDict(dict(
      splits=("test", "ood"), num_problems=51_200, batch_size=1024,
      ceiling_problems=0))  # > 0: estimate each split's accuracy ceiling once per run.
  # Device mesh: `member` x `data` x `fsdp` (-1 = all remaining devices); `member` > 1
  # spreads a population's members over devices.
  c.mesh = ml_collections.ConfigDict(dict(member=1, data=-1, fsdp=1))
  return c

"""A sweep's points grouped into populations: one job trains many points as one program.

Points that agree on everything but the member keys (`run_files.MEMBER_KEYS`: seed,
split seed, learning rate, weight decay, warmup) become the members of one population job
(`hypernet_attention/train/population.py`), at most `max_members` per job. A population
job is itself a point: the shared overrides plus `population.members` (each member's
differing keys) and `population.member_names` (each member's `jobs.point_name`, so its
outputs land in `<job workdir>/<point name>/` and `launch.collect` finds them by name).

The default cap comes from a memory estimate (`default_max_members`): members whose train state and
activations fit in a budget (default 16 GiB, a fraction of one accelerator), at most `MAX_MEMBERS`.
Only this estimate needs JAX: it builds the model abstractly (`build.setup`, `jax.eval_shape`) to
count its parameters and read the task's token count, which depend on the task's encoding (input
width, sequence length, output width: `objectives.synthetic_overrides`), so a closed form here would
repeat every task's encoding. On a launching machine without JAX give the cap
(`--members_per_job=N`) or `--single_runs`; without either, grouping refuses in one line."""

from __future__ import annotations

import hashlib
from typing import Any, Callable, Mapping, Optional, Sequence

from hypernet_attention import errors
from hypernet_attention.runs import config_checks
from hypernet_attention.runs import run_files

MEMBERS_KEY = "population.members"
NAMES_KEY = "population.member_names"
MAX_MEMBERS = 64
DEFAULT_BUDGET_GIB = 16.0


def population_name(common_name: str, member_names: Sequence[str]) -> str:
  """`<shared overrides>,population=<P>x<hash of the member names>`: unique, stable."""
  digest = hashlib.sha1("\n".join(member_names).encode()).hexdigest()[:8]
  return f"{common_name},population={len(member_names)}x{digest}"


def group(points: Sequence[Mapping[str, Any]], max_members: Optional[int],
          name: Callable[[Mapping[str, Any]], str],
          cap_of: Optional[Callable[[dict[str, Any]], int]] = None) -> list[dict[str, Any]]:
  """Population points (in first-appearance order), each of at most `max_members`
  members (None: `cap_of(shared overrides)`); a group of one stays a plain point.
  `name(point)` names a member's directory."""
  if max_members is not None and (not isinstance(max_members, int) or max_members < 1):
    raise ValueError(f"--members_per_job={max_members!r}; allowed: an integer >= 1")
  groups: dict[str, tuple[dict[str, Any], list[Mapping[str, Any]]]] = {}
  for point in points:
    common = {k: v for k, v in point.items() if k not in run_files.MEMBER_KEYS}
    key = repr(sorted(common.items(), key=lambda kv: kv[0]))
    groups.setdefault(key, (common, []))[1].append(point)
  out = []
  for common, members in groups.values():
    cap = max_members or (cap_of(common) if len(members) > 1 else 1)
    num_jobs = -(-len(members) // cap)  # Balanced: 24 members under a cap of 21 -> 12 + 12.
    bounds = [len(members) * j // num_jobs for j in range(num_jobs + 1)]
    for start, stop in zip(bounds[:-1], bounds[1:]):
      chunk = members[start:stop]
      if len(chunk) == 1:
        out.append(dict(chunk[0]))
        continue
      out.append({**common,
                  MEMBERS_KEY: tuple({k: v for k, v in m.items() if k in run_files.MEMBER_KEYS}
                                     for m in chunk),
                  NAMES_KEY: tuple(name(m) for m in chunk)})
  return out


def point_config(point: Mapping[str, Any], experiment: str):
  """The config a point trains (its config argument plus its overrides)."""
  from hypernet_attention.runs import registry  # pylint: disable=g-import-not-at-top
  config = registry.get(experiment).get_config(point["config"])
  for key, value in point.items():
    if key != "config":
      config_checks.set_dotted(config, key, value)
  return config


def member_bytes(config) -> float:
  """Estimated device bytes of one member: parameters, gradients and two Adam moments
  (float32), and the activations of one training step (batch x tokens x width per layer,
  ~24 float32 tensors of that size kept for the backward pass, attention scores on top).
  Imports JAX and the training stack on first use (the module docstring says why)."""
  try:
    import jax  # pylint: disable=g-import-not-at-top

    from hypernet_attention.train import build  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise errors.BadInput(
        f"sizing population jobs by memory builds the model, which needs JAX ({e}); "
        "allowed: a cap, --members_per_job=N, or --single_runs") from None
  s = build.setup(config_checks.validate(config), jax.devices()[:1])
  num_params = sum(x.size for x in jax.tree.leaves(s.abstract_state.params))
  example = jax.eval_shape(lambda b: s.objective.encode(b)[0],
                           s.objective.source.example(config.batch_size))
  batch, tokens = example.shape[:2]
  m = s.model.config
  per_layer = batch * tokens * (24 * m.emb_dim + 4 * m.num_heads * tokens)
  return 4.0 * (4 * num_params + m.num_layers * per_layer)


def default_max_members(config, budget_gib: float = DEFAULT_BUDGET_GIB) -> int:
  """How many members of `config`'s size fit in `budget_gib`, at most `MAX_MEMBERS`."""
  return max(1, min(MAX_MEMBERS, int(budget_gib * 2**30 // member_bytes(config))))

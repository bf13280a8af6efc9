"""`hypernet_attention/train/benchmark.py`'s population table and its step cost: what a
population of P members costs per member-step, against the single run and a FLOP formula."""

import importlib.util
import os
import re
import sys

import jax
import numpy as np
import pytest

from hypernet_attention import errors
from hypernet_attention.train import benchmark
from hypernet_attention.train import build
from hypernet_attention.train import memory
from hypernet_attention.train import population
from hypernet_attention.train import state as state_lib

import train_testlib as tl

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def test_step_cost_scales_with_members_and_covers_the_dense_flops():
  config = benchmark.model_config("fuzzy_logic", "softmax", "smoke")
  one = benchmark.step_cost(benchmark.population_config(config, 1))
  two = benchmark.step_cost(benchmark.population_config(config, 2))
  single = benchmark.prepare(benchmark.population_config(config, 1), 1)
  # Two members do twice one member's work and move about twice its bytes.
  assert two["flops"] == pytest.approx(2 * one["flops"], rel=0.1)
  assert two["bytes_accessed"] == pytest.approx(2 * one["bytes_accessed"], rel=0.25)
  # At least the dense layers' forward + backward: 6 x params x tokens (biases aside).
  example = single.plan.setup.objective.source.example(config.batch_size)
  tokens = config.batch_size * jax.tree.leaves(example)[0].shape[1]
  params = state_lib.count_params(single.state.params)
  assert 6 * params * tokens * 0.5 < one["flops"] < 6 * params * tokens * 20


@pytest.mark.slow
def test_population_table_prints_the_cost_columns():
  out = tl.run(
      [sys.executable, os.path.join("experiments", "benchmark_training.py"),
       "--experiment=fuzzy_logic", "--size=smoke", "--models=hyla", "--members=1,2",
       "--steps=2", "--repeats=1", "--cost"], cwd=REPO, capture_output=True, text=True,
      env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert out.returncode == 0, out.stderr[-2000:]
  rows = [l for l in out.stdout.splitlines() if l.startswith("| fuzzy_logic | smoke | hyla |")]
  assert len(rows) == 2
  gb = [float(r.strip("|").split("|")[-1]) for r in rows]
  assert gb[0] > 0 and gb[1] == pytest.approx(gb[0], rel=0.25)  # Per member: about equal.


def test_random_tokens_are_shifted_rows_in_the_vocabulary_and_resume_exactly(tmp_path):
  """`data.RandomTokens` (the C4 step timed without TensorFlow): rows as `c4.batches` yields
  them, every process its own stream, and a restored iterator continues where it stopped."""
  from hypernet_attention.train import data  # pylint: disable=g-import-not-at-top
  tokens = data.RandomTokens(seed=3, batch_size=4, sequence_length=64, vocab_size=50)
  first, second = next(tokens), next(tokens)
  assert first["inputs"].shape == (4, 64) and first["inputs"].dtype == np.int32
  np.testing.assert_array_equal(first["inputs"][:, 1:], first["targets"][:, :-1])
  np.testing.assert_array_equal(first["weights"], np.ones((4, 64)))
  assert first["inputs"].min() >= 0 and first["targets"].max() < 50
  assert len(np.unique(first["inputs"])) > 40  # Spread over the vocabulary, not constant.
  assert not np.array_equal(first["inputs"], second["inputs"])
  other = next(data.RandomTokens(3, 4, 64, 50, process_index=1, process_count=2))
  assert not np.array_equal(first["inputs"], other["inputs"])
  tokens.save(str(tmp_path))
  expected = next(tokens)
  resumed = data.RandomTokens(seed=3, batch_size=4, sequence_length=64, vocab_size=50)
  resumed.restore(str(tmp_path))
  np.testing.assert_array_equal(next(resumed)["targets"], expected["targets"])


def _no_state(monkeypatch, gib: float):
  """Building any train state fails the test (what must be refused is refused before), and
  the devices hold `gib` GiB (on any backend, so the test holds on any machine)."""
  fail = lambda *a, **k: pytest.fail("a train state was built before the memory check")
  monkeypatch.setattr(build, "init_state", fail)
  monkeypatch.setattr(population.PopulationTrainer, "init_state", fail)
  monkeypatch.setattr(memory, "capacity", lambda devices: memory.Capacity(
      int(gib * 2**30), f"the test's device holds {gib} GiB", 1))


def test_a_model_too_big_is_refused_before_any_state_is_built(monkeypatch):
  """issue 46: `--config_overrides=model.emb_dim=4194304` built its 146 GiB state (the
  kernel's OOM killer ended it) before the check refused it. Now the check reads the chunk
  compiled for the abstract state, and every model is checked before any is built."""
  _no_state(monkeypatch, gib=1)
  small = benchmark.model_config("fuzzy_logic", "softmax", "smoke")
  big = benchmark.model_config("fuzzy_logic", "softmax", "smoke", "model.emb_dim=524288")
  with pytest.raises(errors.BadInput, match=r"^batch_size=16 does not fit in memory: .*"
                     r"the state alone needs .* GiB per device: a smaller model \(model.emb_dim"):
    benchmark.train_steps_per_second([small, big], steps=1, repeats=1)


def test_a_population_too_big_is_refused_before_any_state_is_built(monkeypatch):
  _no_state(monkeypatch, gib=2.5 / 1024)  # The single run fits (about 1 MiB), 4 do not.
  config = benchmark.model_config("fuzzy_logic", "hyla", "smoke")
  with pytest.raises(errors.BadInput, match=r"^batch_size=16 with 4 members does not fit"):
    benchmark.population_plans(config, [1, 4], steps=1)


def _main(monkeypatch, capsys, *flags):
  """benchmark_training.py's main in this process; (exit status, its last stderr line)."""
  spec = importlib.util.spec_from_file_location(
      "benchmark_training", os.path.join(REPO, "experiments", "benchmark_training.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  monkeypatch.setattr(sys, "argv", ["benchmark_training.py", "--experiment=fuzzy_logic",
                                    "--size=smoke", *flags])
  monkeypatch.setattr(benchmark, "plan", lambda *a: pytest.fail("planned a bad request"))
  with pytest.raises(SystemExit) as exited:
    module.main()
  return exited.value.code, capsys.readouterr().err.strip().splitlines()[-1]


FLAG_CASES = {
    # flags: the one line (issue 46: an IndexError, or an unpacking error not naming the flag)
    ("--models=,",): r"--models=','; allowed: comma-separated attention presets",
    ("--models= , ", "--members=1,2"): r"--models=' , '; allowed: comma-separated",
    ("--config_overrides=key",): r"--config_overrides: 'key' is not key=value; allowed: "
                                 r"comma-separated dotted key=value pairs",
    ("--config_overrides=model.emb_dim=four",): r"--config_overrides: "
                                                r"config.model.emb_dim='four'; allowed: an integer",
    ("--config_overrides=async_checkpoints=maybe",):
        r"--config_overrides: config.async_checkpoints='maybe'; allowed: true or false",
    ("--config_overrides==3",): r"--config_overrides: '=3' is not key=value",
    ("--models=hyla@x",): r"--models 'hyla@x': 'x' is not key=value; allowed: "
                          r"preset@dotted.key=value",
    ("--config_overrides=key", "--members=1,2"): r"--config_overrides: 'key' is not key=value",
    ("--steps=99999999999",): r"--steps=99999999999 with --repeats=3 runs 399,999,999,996 "
                              r"steps; allowed: --steps <= 100,000 \(a timed chunk",
    ("--steps=0",): r"--steps=0; allowed: a positive integer",
}


@pytest.mark.parametrize("flags", sorted(FLAG_CASES), ids=" ".join)
def test_bad_flags_are_one_line_naming_the_flag(flags, monkeypatch, capsys):
  status, line = _main(monkeypatch, capsys, *flags)
  assert status == 2
  assert re.match(r"benchmark_training.py: error: " + FLAG_CASES[flags], line), line

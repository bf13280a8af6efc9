"""Latent-code probing: indices, materialized path, statistics on planted codes, restore
across meshes, the CLI end to end and its bad input."""

import json
import os
import shutil
import sys

import jax
import numpy as np
import pytest
import threadpoolctl

from hypernet_attention import errors
from hypernet_attention import hypernetwork
from hypernet_attention.probing import decode
from hypernet_attention.probing import extract
from hypernet_attention.probing import report
from hypernet_attention.probing import stats
from hypernet_attention.probing import weights
from hypernet_attention.train import loop
from hypernet_attention.train import restore

import numerics
import train_testlib as tl

CLI = os.path.join(tl.REPO, "experiments", "probe_latents.py")
FILES = ("codes_8.npz", "codes_0.npz", "metrics.json", "report.md", "decoder_vs_layer.png",
         "embeddings.png", "class_cosines.png", "topographic.png", "generated_weights.png")


@pytest.fixture(autouse=True, scope="module")
def one_thread():
  """As `report.probe_run` does: BLAS/OpenMP threads only contend on these small probes."""
  with threadpoolctl.threadpool_limits(1):
    yield


# Every experiment with a probe setting (its record's `probe`): a new task's record adds it.
PROBED = extract.probed_experiments()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """Finished smoke runs (checkpoints at steps 4 and 8) of every probed experiment."""
  root = tmp_path_factory.mktemp("probe")
  out = {}
  for experiment in PROBED:
    out[experiment] = str(root / experiment)
    loop.train_and_evaluate(tl.smoke(experiment, **{"eval.ceiling_problems": 0}),
                            out[experiment])
  return out


# ------------------------------------------------------------------------- extraction
def test_sraven_pairs_follow_the_token_layout():
  # The authors' setting: K=4, last feature -> query 35, keys 27 and 31.
  q, k = extract.sraven_pairs(4, 3, [3])
  assert q.tolist() == [35] and k.tolist() == [[27, 31]]
  for K, G in ((3, 3), (4, 3), (2, 4)):
    q, k = extract.sraven_pairs(K, G, np.arange(K))
    for f in range(K):  # token = (row, column, slot) in row-major order (SRaven.encode)
      assert q[f] == np.ravel_multi_index((G - 1, G - 1, f), (G, G, K))
      assert k[f].tolist() == [np.ravel_multi_index((G - 1, c, f), (G, G, K))
                               for c in range(G - 1)]


@pytest.mark.parametrize("experiment", PROBED)
def test_materialized_path_equals_fast_path(runs, experiment):
  run = restore.restore_params(runs[experiment])
  split = extract.setting_class(experiment).splits[1]
  batch = run.objective.task.sample(jax.random.key(0), 16, split)
  inputs = run.objective.encode(batch)[0]
  fast = run.model.apply({"params": run.params}, inputs, deterministic=True)
  slow, state = run.model.apply({"params": run.params}, inputs, deterministic=True,
                                mutable=["intermediates"])
  assert len(jax.tree.leaves(state)) == run.config.model.num_layers  # really the slow path
  # Same function, different summation order: float32 rounding only.
  np.testing.assert_allclose(slow, fast, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("experiment", PROBED)
def test_extracted_codes_are_the_hypernetwork_latent_codes(runs, experiment):
  run = restore.restore_params(runs[experiment])
  codes = extract.extract_codes(run, num_problems=8, progress=False)
  setting = extract.make_setting(experiment, run.objective.task)
  batch = setting.batch(
      jax.random.fold_in(jax.random.fold_in(jax.random.key(extract.PROBE_SEED), 0), 0), 8,
      setting.splits[0])
  calls = weights.attention_calls(run.model, run.params, run.objective.encode(batch)[0])
  for layer, (path, module, inputs) in enumerate(calls):
    params = run.params[path[0]][path[1]]
    code_BHQK = np.asarray(hypernetwork.latent_code(module, params, inputs))
    want_BHP = code_BHQK[:, :, setting.query_P, setting.key_P]
    got = setting.samples(batch, want_BHP[:, None])["codes_NLC"][:, 0]
    # Two float32 evaluations of the same scores: within the float32 reordering bound of
    # the score reduction (tests/numerics.py), whatever the CPU.
    n = run.config.model.qk_dim * run.config.model.num_heads
    assert numerics.rel_err(codes.split(0).codes_NLC[:, layer], got) < numerics.error_bound(
        0.0, n, np.float32)
  # In-distribution and held-out problems never share a task.
  assert not set(codes.split(0).task_N) & set(codes.split(1).task_N)


def test_fuzzy_fixed_query_is_one_point_and_reaches_the_model(runs):
  """The authors' fixed query: one x_q in every problem of both splits, targets evaluated
  there, the context still drawn per problem; HYLA's layer-0 self-code is then one code
  (a function of the query token alone), and with random queries it is not."""
  run = restore.restore_params(runs["fuzzy_logic"])
  task = run.objective.task
  point = np.asarray(extract.fixed_query_point(task.num_variables))
  assert point.shape == (task.num_variables,) and np.all((point >= 0) & (point < 1))
  setting = extract.make_setting("fuzzy_logic", task)
  for split_index, split in enumerate(setting.splits):
    batch = setting.batch(jax.random.key(split_index), 16, split)
    x = np.asarray(batch["x"])
    np.testing.assert_array_equal(x[:, -1], np.broadcast_to(point, x[:, -1].shape))
    assert np.ptp(x[:, :-1], axis=0).min() > 0  # the context varies per problem
    # Zadeh semantics at the query point, written out independently of `evaluate`.
    terms = np.asarray(batch["terms"])
    literals = np.where(terms == 1, point, 1.0 - point)  # (B, K, L)
    np.testing.assert_allclose(np.asarray(batch["y"])[:, -1], literals.min(-1).max(-1))
    tokens = np.asarray(run.objective.encode(batch)[0])
    assert np.ptp(tokens[:, -1], axis=0).max() == 0  # every query token is the same
  assert run.config.model.attention == "hyla"
  fixed = extract.extract_codes(run, num_problems=16, progress=False)
  rand = extract.extract_codes(run, num_problems=16, progress=False, query="random")
  assert fixed.setting.endswith("query=fixed") and rand.setting.endswith("query=random")
  assert np.ptp(fixed.codes_NLC[:, 0], axis=0).max() == 0
  assert np.ptp(rand.codes_NLC[:, 0], axis=0).max() > 0
  assert np.ptp(fixed.codes_NLC[:, -1], axis=0).max() > 0  # later layers read the context
  with pytest.raises(ValueError, match="query='random' for sraven; allowed: 'fixed'"):
    extract.make_setting("sraven", restore.restore_params(runs["sraven"]).objective.task,
                         query="random")


# ----------------------------------------------------------------------- statistics
def _planted(signal: float, seed: int = 0, features: int = 3, rules: int = 8, width: int = 16):
  """SRAVEN-like samples: code = onehot(rule of f) W_f + noise; tasks = rule tuples."""
  rng = np.random.default_rng(seed)
  tasks = rng.integers(0, rules, (60, features))
  w = np.linalg.qr(rng.normal(size=(width, width)))[0][:rules]  # orthonormal rows
  task_N = np.repeat(np.arange(60), 10 * features)
  stratum_N = np.tile(np.arange(features), 600)
  y = tasks[task_N, stratum_N]
  x = signal * w[y] + 0.1 * rng.normal(size=(len(y), width))
  side = decode.Side(x, y, task_N, task_N * features + stratum_N, stratum_N)
  fit, score = task_N < 40, task_N >= 40
  return side.take(fit), side.take(score), tasks


def test_planted_codes_decode_and_are_topographic():
  fit, score, tasks = _planted(signal=1.0)
  result = decode.decode_multiclass(fit, score, 8, num_permutations=30)
  assert result.scores["accuracy"] > 0.97 and result.scores["balanced_accuracy"] > 0.97
  assert result.p_value["accuracy"] == pytest.approx(1 / 31)  # above every shuffle
  assert result.chance["most_frequent"]["accuracy"] < 0.4
  sel = decode.selectivity(fit, result.c)
  assert sel["real"] > 0.97 and sel["selectivity"] > 0.3
  ids, means = stats.task_means(score.x_NC, score.task_N, score.stratum_N)
  topo = stats.topographic_similarity(means, tasks[ids], num_permutations=199)
  # Hamming distances take 4 values; continuous code distances can reach at most the ceiling.
  assert topo.rho > 0.95 * topo.rho_ceiling and topo.p_value == pytest.approx(1 / 200)
  exact = stats.topographic_similarity(np.eye(8)[tasks].reshape(len(tasks), -1), tasks, 99)
  assert exact.rho == pytest.approx(1.0)  # noise-free codes: cosine distance = Hamming / K


def test_label_independent_codes_decode_at_chance():
  fit, score, tasks = _planted(signal=0.0, seed=1)
  result = decode.decode_multiclass(fit, score, 8, num_permutations=50)
  assert result.p_value["accuracy"] > 0.05 and result.p_value["balanced_accuracy"] > 0.05
  assert abs(result.scores["balanced_accuracy"] - 1 / 8) < 0.06
  ids, means = stats.task_means(score.x_NC, score.task_N, score.stratum_N)
  assert stats.topographic_similarity(means, tasks[ids], num_permutations=199).p_value > 0.05


def test_planted_terms_decode_multilabel():
  rng = np.random.default_rng(0)
  presence = np.zeros((40, 8), int)
  for t in range(40):
    presence[t, rng.choice(8, 2, replace=False)] = 1
  task_N = np.repeat(np.arange(40), 20)
  w = np.linalg.qr(rng.normal(size=(8, 8)))[0]
  x = presence[task_N] @ w + 0.2 * rng.normal(size=(len(task_N), 8))
  side = decode.Side(x, presence[task_N], task_N, task_N, np.zeros_like(task_N))
  fit, score = side.take(task_N < 25), side.take(task_N >= 25)
  result = decode.decode_multilabel(fit, score, num_permutations=20)
  assert result.macro_f1 > 0.95 and result.p_value == pytest.approx(1 / 21)
  assert result.chance["always_positive"] < 0.5
  mixed = np.random.default_rng(1).permutation(len(fit.y))  # halves from the same tasks
  assert decode.ridge_r2(fit.x_NC[mixed], fit.y[mixed]) > 0.8


def test_grouped_folds_and_unit_permutations():
  fit, _, _ = _planted(signal=1.0)
  for train, test in decode.cv_splits(fit, seed=0):
    assert not set(fit.task_N[train]) & set(fit.task_N[test])
  rng = np.random.default_rng(0)
  y = stats.permute_units(fit.unit_N, fit.y, fit.stratum_N, rng)
  per_unit, index = stats.unit_labels(fit.unit_N, y)  # raises if a unit's label is split
  for s in range(3):  # shuffled within the feature: the same multiset of unit labels
    units = np.unique(fit.unit_N[fit.stratum_N == s])
    np.testing.assert_array_equal(
        np.sort(stats.unit_labels(fit.unit_N, fit.y)[0][np.searchsorted(
            np.unique(fit.unit_N), units)]),
        np.sort(per_unit[np.searchsorted(np.unique(fit.unit_N), units)]))
  assert not np.array_equal(y, fit.y)


# ------------------------------------------------------- restore across device counts
_FAKE_DEVICES = r"""
import os, sys
sys.path.insert(0, os.path.join(sys.argv[1], "tests"))
import jax
jax.config.update("jax_platforms", "cpu")
jax.config.update("jax_num_cpu_devices", 4)
import numerics
import train_testlib as tl
from hypernet_attention.probing import extract
from hypernet_attention.runs import config_checks
from hypernet_attention.train import build, loop, restore
config = tl.smoke("sraven", **{"eval.ceiling_problems": 0, "mesh.data": 2, "mesh.fsdp": 2})
summary = loop.train_and_evaluate(config, sys.argv[2], devices=jax.devices())
assert len(jax.devices()) == 4
setup = build.setup(config_checks.validate(config), jax.devices())
live = restore.RestoredRun(sys.argv[2], 8, config, summary["state"].params, setup.model,
                           setup.objective)
extract.extract_codes(live, num_problems=16, progress=False).save(sys.argv[3])
"""


def test_codes_saved_on_four_devices_restore_on_one(tmp_path):
  workdir, live_path = tmp_path / "wd", tmp_path / "live.npz"
  proc = tl.run([sys.executable, "-c", _FAKE_DEVICES, tl.REPO, str(workdir),
                 str(live_path)], env=tl.subprocess_env(), capture_output=True,
                text=True)
  assert proc.returncode == 0, proc.stderr[-3000:]
  run = restore.restore_params(str(workdir))
  assert run.step == 8 and len(jax.tree.leaves(run.params)[0].devices()) == 1
  restored = extract.extract_codes(run, num_problems=16, progress=False)
  live = extract.Codes.load(str(live_path))
  np.testing.assert_array_equal(restored.labels, live.labels)
  # Same parameters; the 2x2 mesh splits reductions differently: float32 rounding only
  # (a norm-wise error: RMSHead amplifies rounding where a pair's scores are ~0 over heads).
  assert numerics.rel_err(restored.codes_NLC, live.codes_NLC) < 1e-5


# ------------------------------------------------------------------- CLI and bad input
def _cli(*args):
  return tl.run([sys.executable, CLI, *args], env=tl.subprocess_env(),
                capture_output=True, text=True, cwd=tl.REPO)


@pytest.mark.slow
def test_cli_end_to_end_writes_every_file(runs, tmp_path):
  out = tmp_path / "out"
  before = {k: tl.snapshot(v) for k, v in runs.items()}
  proc = _cli(*[f"--workdir={runs[name]}" for name in PROBED],
              f"--output_dir={out}", "--num_problems=96", "--permutations=5")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert {k: tl.snapshot(v) for k, v in runs.items()} == before  # the runs are read-only
  for name in PROBED:  # all 'hyla': named by directory
    assert sorted(os.listdir(out / name)) == sorted(FILES), name
    metrics = json.loads((out / name / "metrics.json").read_text())
    assert metrics["step"] == 8 and set(metrics["trained"]) == {"layer 0", "layer 1",
                                                                report.ALL_LAYERS}
    assert "![decoder_vs_layer](decoder_vs_layer.png)" in (out / name / "report.md").read_text()
  assert {"report.md", "metrics.json", "decoder_vs_layer.png"} <= set(os.listdir(out))
  assert len(proc.stdout.strip().splitlines()) == len(PROBED)  # one result line per run


def test_bad_input_one_line_nonzero_exit_nothing_written(runs, tmp_path):
  before = tl.snapshot(runs["sraven"])
  proc = _cli(f"--workdir={runs['sraven']}", "--step=5")
  assert proc.returncode == 2
  assert proc.stderr.strip().splitlines()[-1].startswith(
      "probe_latents.py: error: no checkpoint at step 5")
  assert "available steps: [4, 8]" in proc.stderr
  assert tl.snapshot(runs["sraven"]) == before


def test_bad_input_library_errors(runs, tmp_path):
  options = report.ProbeOptions(num_problems=8, permutations=0, progress=False)
  empty = tmp_path / "empty"
  empty.mkdir()
  (empty / "config.json").write_text(open(os.path.join(runs["sraven"], "config.json")).read())
  other, plain = tmp_path / "other", tmp_path / "plain"
  other.mkdir()
  plain.mkdir()
  (plain / "notes.txt").write_text("not a run")
  config = json.loads(open(os.path.join(runs["sraven"], "config.json")).read())
  (other / "config.json").write_text(json.dumps({**config, "experiment": "c4_lm"}))
  cases = [
      ([str(tmp_path / "nope")], None, "does not exist"),
      ([str(plain)], None, "holds no config.json"),
      ([str(empty)], None, "no checkpoints in"),
      ([str(other)], None, "is a 'c4_lm' run; allowed experiments: \\['fuzzy_logic', 'sraven'\\]"),
      ([runs["sraven"], runs["fuzzy_logic"]], None, "2 workdirs given without --output_dir"),
  ]
  for workdirs, step, message in cases:
    with pytest.raises(ValueError, match=message):
      report.probe_workdirs(workdirs, step, options)
  assert not os.path.exists(os.path.join(runs["sraven"], "probe"))
  for bad, message in ((dict(num_problems=0), "num_problems=0"),
                       (dict(features="first"), "features='first'; allowed"),
                       (dict(query="mean"), "query='mean'; allowed"),
                       (dict(permutations=-1), "permutations=-1")):
    with pytest.raises(ValueError, match=message):
      report.ProbeOptions(**bad)


# -------------------------------------------- half-written checkpoints, populations (issue 25)
def test_half_written_or_corrupt_checkpoint_names_the_step(runs, tmp_path):
  run = tmp_path / "run"
  shutil.copytree(runs["sraven"], run)
  # A save cut off by a kill: Orbax's temporary directory, never finalized.
  (run / "checkpoints" / "8").rename(run / "checkpoints" / "8.orbax-checkpoint-tmp-1700000000")
  with pytest.raises(ValueError, match=r"no checkpoint at step 8 .*\(step 8 is half-written: "
                     r"its save is running or was cut off.*available steps: \[4\].*--step=4"):
    restore.restore_params(str(run), 8)
  assert restore.restore_params(str(run)).step == 4  # The newest finalized step.
  corrupt = tmp_path / "corrupt"
  shutil.copytree(runs["sraven"], corrupt)
  for f in (corrupt / "checkpoints" / "8" / "state").rglob("*"):
    if f.is_file() and f.suffix != ".json" and "metadata" not in f.name:
      f.write_bytes(b"")  # Truncated array data (metadata intact).
  before = tl.snapshot(str(corrupt))
  with pytest.raises(ValueError, match=r"checkpoint step 8 in .* is unreadable \(half-written "
                     r"or corrupt.*allowed: --step=4"):
    restore.restore_params(str(corrupt))
  assert tl.snapshot(str(corrupt)) == before  # Read-only: nothing moved aside.


def _fake_population(directory, names) -> None:
  config = {"experiment": "fuzzy_logic", "model": {"attention": "hyla"},
            "population": {"members": [{"seed": i} for i in range(len(names))],
                           "member_names": list(names)}}
  directory.mkdir(parents=True)
  (directory / "config.json").write_text(json.dumps(config))
  for i, name in enumerate(names):
    (directory / name).mkdir()
    (directory / name / "config.json").write_text(json.dumps(
        {**config, "seed": i, "population": {"members": [], "member_names": []}}))


def test_roots_of_populations_resolve_to_one_probe_per_member(tmp_path):
  root = tmp_path / "root"
  _fake_population(root / "pop_a", ("member0", "member1"))
  _fake_population(root / "pop_b", ("member0", "member1"))
  runs_, where = report.resolve_workdirs([str(root)])
  assert where == str(root) and runs_ == [str(root / p / m) for p in ("pop_a", "pop_b")
                                          for m in ("member0", "member1")]
  assert report.run_names(runs_, ["hyla"] * 4) == [
      "pop_a/member0", "pop_a/member1", "pop_b/member0", "pop_b/member1"]
  runs_, where = report.resolve_workdirs([str(root / "pop_a")])
  assert where == str(root / "pop_a") and len(runs_) == 2


def test_probe_a_population_probes_every_member(tmp_path):
  config = tl.smoke("fuzzy_logic")
  config.population.members = ({"seed": 0}, {"seed": 1})
  population_dir = str(tmp_path / "pop")
  loop.train_and_evaluate(config, population_dir)
  options = report.ProbeOptions(num_problems=16, permutations=0, progress=False)
  with pytest.raises(errors.BadInput, match="--output_dir='.*' is a file"):
    report.probe_workdirs([population_dir], None, options, str(tmp_path / "pop" / "config.json"))
  probes = report.probe_workdirs([population_dir], None, options)
  assert [p.name for p in probes] == ["member0", "member1"]
  for name in ("member0", "member1"):
    assert os.path.exists(os.path.join(population_dir, "probe", name, "metrics.json"))
  assert os.path.exists(os.path.join(population_dir, "probe", "report.md"))

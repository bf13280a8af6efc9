"""Each objective's loss and metrics against a hand formula in float64 numpy, on tiny arrays.

No model and no training loop: the objectives are built from the smoke configs and their
`metrics_fn` is fed logits chosen here (random, or set so that the outcome is known), so a
wrong slice, axis, reduction or weighting shows up as a number that differs.
"""

import jax
import numpy as np
import pytest

from hypernet_attention.train import data
from hypernet_attention.train import objectives

import train_testlib as tl

TOL = dict(rtol=1e-5, atol=1e-6)  # float32 cross-entropy of O(1) values against float64.


def _log_softmax(logits):
  logits = np.asarray(logits, np.float64)
  shifted = logits - logits.max(-1, keepdims=True)
  return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


@pytest.fixture(scope="module")
def sraven():
  return objectives.build(tl.smoke("sraven", **{"eval.ceiling_problems": 0}))


def test_sraven_loss_and_accuracy_read_the_query_tokens_only(sraven):
  task = sraven.task
  batch = jax.tree.map(np.asarray, task.sample(jax.random.key(0), 3, "train"))
  inputs, targets_BK = map(np.asarray, task.encode(batch))
  B, T, K, F = inputs.shape[0], inputs.shape[1], task.num_features, task.num_values
  logits_BTF = np.random.default_rng(0).normal(size=(B, T, F)).astype(np.float32)
  # Row 0 right on every feature, row 1 wrong on feature 0 only, row 2 as drawn.
  for k in range(K):
    logits_BTF[0, T - K + k, targets_BK[0, k]] = 20.0
    logits_BTF[1, T - K + k, targets_BK[1, k]] = 20.0
  logits_BTF[1, T - K, (targets_BK[1, 0] + 1) % F] = 40.0
  got = jax.tree.map(np.asarray, sraven.metrics_fn(logits_BTF, batch))

  log_p_BKF = _log_softmax(logits_BTF[:, -K:])
  want_loss_B = -np.take_along_axis(log_p_BKF, targets_BK[..., None], -1)[..., 0].mean(-1)
  correct_BK = logits_BTF[:, -K:].argmax(-1) == targets_BK
  np.testing.assert_allclose(got["loss"], want_loss_B, **TOL)
  np.testing.assert_array_equal(got["accuracy"], correct_BK.all(-1))
  assert got["accuracy"][0] == 1.0 and got["accuracy"][1] == 0.0
  assert got["accuracy_feature0"][1] == 0.0 and got["accuracy_feature1"][1] == 1.0
  for k in range(K):
    np.testing.assert_array_equal(got[f"accuracy_feature{k}"], correct_BK[:, k])
  assert sorted(got) == sorted(["loss", "accuracy"] + [f"accuracy_feature{k}" for k in range(K)])
  # The context tokens' outputs are not read: changing them changes nothing.
  logits_BTF[:, :T - K] = 1e3
  again = sraven.metrics_fn(logits_BTF, batch)
  np.testing.assert_array_equal(np.asarray(again["loss"]), got["loss"])


def test_sraven_fixes_the_model_fields_and_reports_chance(sraven, tmp_path):
  task = sraven.task
  T = task.grid_size ** 2 * task.num_features
  assert sraven.model_overrides == dict(input_kind="dense", output_dim=task.num_values,
                                        num_buckets=T, max_distance=T)
  assert sraven.main_metric == "accuracy" and sraven.source.on_device
  config = tl.smoke("sraven", **{"eval.ceiling_problems": 0})
  run = sraven.run_metrics(config, str(tmp_path))
  chance = task.num_values ** -float(task.num_features)  # Every feature guessed right.
  assert run == {f"{s}/accuracy_chance": pytest.approx(chance) for s in config.eval.splits}


def test_fuzzy_logic_squared_error_and_r2_of_the_query():
  objective = objectives.build(tl.smoke("fuzzy_logic"))
  batch = jax.tree.map(np.asarray, objective.source.sample(jax.random.key(1), 4, "train"))
  y_BN = np.asarray(batch["y"], np.float64)
  B, N = y_BN.shape
  outputs_BT1 = np.random.default_rng(1).normal(size=(B, N, 1)).astype(np.float32)
  outputs_BT1[0, -1, 0] = y_BN[0, -1]  # An exact prediction: loss 0, R^2 1.
  got = jax.tree.map(np.asarray, objective.metrics_fn(outputs_BT1, batch))
  pred_B = outputs_BT1[:, -1, 0].astype(np.float64)
  want_loss = (pred_B - y_BN[:, -1]) ** 2
  # R^2 against predicting the sequence's mean: 1 - SE / mean((y - mean(y))^2).
  want_r2 = 1 - want_loss / ((y_BN - y_BN.mean(-1, keepdims=True)) ** 2).mean(-1)
  np.testing.assert_allclose(got["loss"], want_loss, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(got["r2"], want_r2, rtol=1e-4, atol=1e-5)
  assert got["loss"][0] < 1e-10 and got["r2"][0] == pytest.approx(1.0)
  assert objective.model_overrides == dict(input_kind="dense", output_dim=1, num_buckets=N,
                                           max_distance=N)


@pytest.fixture(scope="module")
def lm():
  return objectives.build(tl.smoke("c4_lm", **{"task.name": objectives.SYNTHETIC_LM}))


def test_language_model_metrics_weigh_tokens(lm):
  V = lm.model_overrides["vocab_size"]
  rng = np.random.default_rng(2)
  B, T = 3, 5
  targets_BT = rng.integers(0, V, (B, T)).astype(np.int32)
  weights_BT = np.array([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [0, 0, 0, 0, 0]], np.int32)
  logits_BTV = rng.normal(size=(B, T, V)).astype(np.float32)
  logits_BTV[0, 0, targets_BT[0, 0]] = 50.0  # One sure right token in row 0.
  batch = {"inputs": targets_BT, "targets": targets_BT, "weights": weights_BT}
  got = jax.tree.map(np.asarray, lm.metrics_fn(logits_BTV, batch))

  nats_BT = -np.take_along_axis(_log_softmax(logits_BTV), targets_BT[..., None], -1)[..., 0]
  right_BT = logits_BTV.argmax(-1) == targets_BT
  for b in range(2):
    w = weights_BT[b].astype(bool)
    np.testing.assert_allclose(got["loss"][b], nats_BT[b, w].mean(), **TOL)
    np.testing.assert_allclose(got["row_nats"][b], nats_BT[b, w].sum(), **TOL)
    np.testing.assert_allclose(got["accuracy"][b], right_BT[b, w].mean(), **TOL)
  # A row with no weighted token counts nothing (and is not a division by zero).
  assert got["loss"][2] == got["accuracy"][2] == got["row_nats"][2] == 0.0
  np.testing.assert_array_equal(got["row_bytes"], 0.0)  # Random tokens have no text.
  assert lm.model_overrides == dict(input_kind="embed", vocab_size=V, output_dim=V)
  assert isinstance(lm.source, data.HostSource)


def test_language_model_finalize_is_a_ratio_of_sums(lm):
  means = {"loss": 2.0, "accuracy": 0.25, "row_nats": 30.0, "row_bytes": 12.0}
  out = lm.finalize(means)
  assert out == {"loss": 2.0, "accuracy": 0.25, "perplexity": pytest.approx(np.exp(2.0)),
                 "bits_per_byte": pytest.approx(30.0 / 12.0 / np.log(2.0))}
  assert "row_nats" in means  # Its input is not changed.
  no_text = lm.finalize({"loss": 1.0, "row_nats": 5.0, "row_bytes": 0.0})
  assert no_text == {"loss": 1.0, "perplexity": pytest.approx(np.e)}


def test_split_seed_follows_the_run_unless_fixed():
  assert objectives.split_seed(tl.smoke("sraven", seed=5)) == 5
  assert objectives.split_seed(tl.smoke("sraven", seed=5, **{"task.split_seed": 0})) == 0


def test_unknown_task_key_and_experiment_are_refused_naming_the_allowed():
  config = tl.smoke("fuzzy_logic")
  with config.unlocked():
    config.task.nope = 1
  with pytest.raises(ValueError, match=r"unknown task config keys \['nope'\].*allowed: .*"
                     "num_variables"):
    objectives.build(config)
  config = tl.smoke("sraven")
  config.experiment = "nope"
  with pytest.raises(ValueError, match="unknown experiment 'nope'; allowed: sraven"):
    objectives.build(config)

"""Train state creation and the optimizer, without the loop.

The state of a small transformer has the parameter count a hand formula gives, boxed leaves
with one logical name per axis, and Adam moments shaped like the parameters. AdamW's first
two updates match Adam with bias correction and decoupled weight decay written out in
float64 numpy (no decay on 1-D parameters); the learning rate follows linear warmup then
cosine to `end_lr_fraction` x peak; a population member's traced optimizer equals the
single-run optimizer built with its values.
"""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from hypernet_attention import transformer
from hypernet_attention.train import build
from hypernet_attention.train import state as state_lib

import train_testlib as tl

MODEL = dict(num_layers=2, emb_dim=32, num_heads=4, qk_dim=16, v_dim=16, mlp_dim=64,
             attention="softmax", feed_forward="gelu_mlp", position="t5")
IN, OUT, BUCKETS = 8, 8, 36  # Input features, outputs, T5 relative-position buckets.


def _param_count(num_layers, emb_dim, num_heads, qk_dim, v_dim, mlp_dim, **_):
  """Dense input -> pre-norm blocks (q, k, v, out with biases, one T5 bias table per head,
  two LayerNorms, a 2-layer MLP) -> final LayerNorm -> readout."""
  D = emb_dim
  attention = 2 * (D * qk_dim + qk_dim) + (D * v_dim + v_dim) + (v_dim * D + D)
  block = attention + num_heads * BUCKETS + 2 * 2 * D + (D * mlp_dim + mlp_dim) + (mlp_dim * D + D)
  return (IN * D + D) + num_layers * block + 2 * D + (D * OUT + OUT)


@pytest.fixture(scope="module")
def abstract_state():
  config = tl.smoke("sraven")
  model = transformer.Transformer(build.transformer_config(
      MODEL, input_kind="dense", output_dim=OUT, num_buckets=BUCKETS, max_distance=BUCKETS))
  tx = state_lib.make_optimizer(config)
  init = state_lib.make_init_fn(model, jnp.zeros((1, BUCKETS, IN)), tx)
  return jax.eval_shape(init, jax.random.key(0))  # Shapes and logical axes, nothing computed.


def test_state_has_the_hand_counted_parameters_and_adam_moments(abstract_state):
  assert state_lib.count_params(abstract_state.params) == _param_count(**MODEL) == 13_800
  assert abstract_state.step.shape == () and abstract_state.step.dtype == jnp.int32
  params = nn.meta.unbox(abstract_state.params)
  shapes = jax.tree.map(lambda x: x.shape, params)
  for moment in ("mu", "nu"):
    assert jax.tree.map(lambda x: x.shape, nn.meta.unbox(
        optax.tree_utils.tree_get(abstract_state.opt_state, moment))) == shapes
  assert params["layers_1"]["attention"]["query"]["kernel"].shape == (32, 4, 4)  # D, H, qk/H


def test_every_parameter_carries_one_logical_name_per_axis(abstract_state):
  boxed = jax.tree_util.tree_leaves_with_path(
      abstract_state.params, is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))
  assert len(boxed) == 40 and all(isinstance(b, nn.LogicallyPartitioned) for _, b in boxed)
  for path, b in boxed:
    assert len(b.names) == len(b.value.shape), (path, b)
    # The model width is the axis fsdp splits: every kernel reads or writes it, by that name.
    if jax.tree_util.keystr(path).endswith("['kernel']"):
      assert b.value.shape[b.names.index("embed")] == MODEL["emb_dim"], (path, b)


def _adamw_by_hand(params, grads, lrs, b1, b2, eps, wd):
  """Adam with bias correction, then decoupled weight decay on >1-D parameters, in float64."""
  p = {k: np.asarray(v, np.float64) for k, v in params.items()}
  m = {k: np.zeros_like(v) for k, v in p.items()}
  v = {k: np.zeros_like(x) for k, x in p.items()}
  for t, (g, lr) in enumerate(zip(grads, lrs), start=1):
    for k in p:
      m[k] = b1 * m[k] + (1 - b1) * g[k]
      v[k] = b2 * v[k] + (1 - b2) * g[k] ** 2
      update = (m[k] / (1 - b1 ** t)) / (np.sqrt(v[k] / (1 - b2 ** t)) + eps)
      if p[k].ndim > 1:
        update = update + wd * p[k]
      p[k] = p[k] - lr * update
  return p


def test_two_adamw_steps_match_the_formula_and_skip_decay_on_biases():
  config = tl.smoke("sraven", **{"optimizer.warmup_steps": 0, "optimizer.learning_rate": 0.1,
                                 "optimizer.weight_decay": 0.5, "optimizer.grad_clip_norm": 0.0})
  rng = np.random.default_rng(0)
  params = {"kernel": rng.normal(size=(3, 2)).astype(np.float32),
            "bias": rng.normal(size=(2,)).astype(np.float32)}
  grads = [{k: rng.normal(size=x.shape).astype(np.float32) for k, x in params.items()}
           for _ in range(2)]
  assert state_lib.weight_decay_mask(params) == {"kernel": True, "bias": False}
  tx = state_lib.make_optimizer(config)
  opt_state, p = tx.init(params), params
  for g in grads:
    updates, opt_state = tx.update(g, opt_state, p)
    p = optax.apply_updates(p, updates)
  schedule = state_lib.learning_rate_schedule(config)
  opt = config.optimizer
  want = _adamw_by_hand(params, grads, [float(schedule(0)), float(schedule(1))],
                        opt.b1, opt.b2, opt.eps, opt.weight_decay)
  for k in params:
    np.testing.assert_allclose(np.asarray(p[k]), want[k], rtol=1e-5, atol=1e-6)
  assert not np.allclose(p["bias"], params["bias"])  # It moved, without decay.


def _schedule_by_hand(t, peak, warmup, total, end_fraction, authors):
  if t < warmup:
    return peak * t / warmup
  decay = total - warmup if authors else max(total, warmup + 1)  # optax counts warmup in it.
  progress = min(t - warmup, decay - warmup) / (decay - warmup)
  end = end_fraction * peak
  return end + (peak - end) * 0.5 * (1 + math.cos(math.pi * progress))


@pytest.mark.parametrize("authors", [False, True])
def test_learning_rate_schedule_and_its_traced_twin_follow_the_formula(authors):
  config = tl.smoke("sraven", num_train_steps=50, **{
      "optimizer.warmup_steps": 10, "optimizer.learning_rate": 2e-3,
      "optimizer.end_lr_fraction": 0.1, "optimizer.authors_schedule": authors})
  static = state_lib.learning_rate_schedule(config)
  traced = state_lib.traced_learning_rate_schedule(config, jnp.float32(2e-3), jnp.int32(10))
  steps = np.arange(51)
  want = [_schedule_by_hand(t, 2e-3, 10, 50, 0.1, authors) for t in steps]
  np.testing.assert_allclose(np.asarray(static(steps)), want, rtol=1e-5, atol=1e-9)
  np.testing.assert_allclose(np.asarray(traced(steps)), want, rtol=1e-5, atol=1e-9)
  # Ours reaches the floor at the last step, the authors' `warmup_steps` steps earlier.
  floor_from = 10 + int(np.argmax(np.isclose(want[10:], 2e-4, rtol=1e-6, atol=0)))
  assert floor_from == (40 if authors else 50)


def test_a_members_traced_optimizer_is_the_single_run_optimizer_with_its_values():
  values = {"learning_rate": 3e-2, "weight_decay": 0.2, "warmup_steps": 3}
  base = tl.smoke("sraven")
  single = tl.smoke("sraven", **{f"optimizer.{k}": v for k, v in values.items()})
  member = {k: jnp.asarray(v) for k, v in values.items()}
  rng = np.random.default_rng(1)
  params = {"w": rng.normal(size=(4, 3)).astype(np.float32),
            "b": rng.normal(size=(3,)).astype(np.float32)}
  results = []
  for tx in (state_lib.make_optimizer(single), state_lib.make_optimizer(base, member)):
    p, opt_state = params, tx.init(params)
    for step in range(6):
      g = jax.tree.map(lambda x, s=step: jnp.sin(x * (s + 1)), p)
      updates, opt_state = tx.update(g, opt_state, p)
      p = optax.apply_updates(p, updates)
    results.append(p)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), *results)
  assert not np.allclose(results[0]["w"], params["w"])

"""A name added to the ops' reference alone is computed as the reference says or refused in
one line, by every public entry; none computes something else.

The reference (`ops/reference.py`) is the spec of every normalization, value network and
activation (the paper's Eqs. 2-7). Here a normalization (a_hqk = sigmoid(s_hqk)) and a value
network (y_qh = phi(sum_k a_hqk v_kh)) are registered there and nowhere else, with an
attention preset naming each: `ops.dispatch`, the Linen and NNX modules, the explicit
hypernetwork form and probing's reader of generated weights then give the reference's
numbers, or an `errors.BadInput` of one line naming the name. (The hypernetwork form once
computed RMSHead for any normalization it did not know.)
"""

import types

from flax import nnx
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hypernet_attention import attention
from hypernet_attention import errors
from hypernet_attention import feed_forward
from hypernet_attention import hypernetwork
from hypernet_attention import nnx_attention
from hypernet_attention import presets
from hypernet_attention import transformer
from hypernet_attention.ops import dispatch
from hypernet_attention.ops import reference
from hypernet_attention.probing import weights
from hypernet_attention.train import build
from hypernet_attention.train import objectives

import train_testlib as tl

B, T, E, H, D = 2, 5, 8, 2, 3
NORMALIZATION, VALUE_NETWORK = "sigmoid_scores", "squashed_linear"


def _sigmoid_scores(scores_BHQK, mask, eps):
  del eps
  code = jax.nn.sigmoid(scores_BHQK)
  return code if mask is None else jnp.where(mask, code, 0.0)


def _squashed_linear(code_BHQK, value_BKHV, phi, value_weight_HVV):
  del value_weight_HVV
  return phi(jnp.einsum("bhqk,bkhv->bqhv", code_BHQK, value_BKHV))


@pytest.fixture
def new_names(monkeypatch):
  """The two names in the reference's registries, and a preset for each ('new_norm': HYLA
  with the new normalization; 'new_value': RMSHead with the new value network)."""
  monkeypatch.setitem(reference.NORMALIZATIONS, NORMALIZATION, _sigmoid_scores)
  monkeypatch.setitem(reference.VALUE_NETWORKS, VALUE_NETWORK, _squashed_linear)
  monkeypatch.setitem(presets.PRESETS, "new_norm",
                      presets.AttentionPreset(NORMALIZATION, "mlp", "relu"))
  monkeypatch.setitem(presets.PRESETS, "new_value",
                      presets.AttentionPreset("rms_head", VALUE_NETWORK, "tanh"))


def _refused(call, *names):
  """`call()` raises BadInput: one line, naming each of `names` and what is allowed."""
  with pytest.raises(errors.BadInput) as refusal:
    call()
  message = str(refusal.value)
  assert "\n" not in message and ("allowed" in message or "it computes" in message), message
  for name in names:
    assert repr(name) in message, message


def _operands(seed=0):
  keys = jax.random.split(jax.random.key(seed), 3)
  return (jax.random.normal(keys[0], (B, T, H, D)), jax.random.normal(keys[1], (B, T, H, D)),
          jax.random.normal(keys[2], (B, T, H, D)))


def _spec(query, key, value, normalization, value_network, activation):
  """The registered functions applied by hand: scores, code, value network."""
  scores = jnp.einsum("bqhd,bkhd->bhqk", query, key) / np.sqrt(query.shape[-1])
  code = reference.NORMALIZATIONS[normalization](scores, None, reference.RMS_HEAD_EPS)
  return reference.VALUE_NETWORKS[value_network](
      code, value, reference.ACTIVATIONS[activation], None)


@pytest.mark.parametrize("normalization,value_network", [(NORMALIZATION, "mlp"),
                                                         ("rms_head", VALUE_NETWORK)])
def test_dispatch_computes_the_reference_or_refuses(new_names, normalization, value_network):
  del new_names
  query, key, value = _operands()
  call = lambda implementation: dispatch.attention(
      query, key, value, normalization=normalization, value_network=value_network,
      activation="relu", implementation=implementation)
  expected = _spec(query, key, value, normalization, value_network, "relu")
  for implementation in ("auto", "reference"):
    np.testing.assert_allclose(call(implementation), expected, rtol=1e-5, atol=1e-6)
  new = normalization if normalization == NORMALIZATION else value_network
  for implementation in (*dispatch.FAST_PATHS, *dispatch.EXPLICIT_PATHS):
    _refused(lambda i=implementation: call(i), implementation, new)


def _linen(preset, **kw):
  return attention.MultiHeadAttention(num_heads=H, attention=preset, qk_features=H * D,
                                      v_features=H * D, **kw)


def _linen_params(module, x):
  return nn.meta.unbox(module.init(jax.random.key(1), x)["params"])


def _inputs():
  return jax.random.normal(jax.random.key(2), (B, T, E))


def test_modules_and_hypernetwork_compute_a_new_normalization(new_names):
  """Linen (fast and materialized), NNX and the explicit hypernetwork form: one function."""
  del new_names
  module, x = _linen("new_norm"), _inputs()
  params = _linen_params(module, x)
  out, state = module.apply({"params": params}, x, mutable=["intermediates"])
  (code,) = state["intermediates"]["latent_code"]
  q = jnp.einsum("bte,ehd->bthd", x, params["query"]["kernel"]) + params["query"]["bias"]
  k = jnp.einsum("bte,ehd->bthd", x, params["key"]["kernel"]) + params["key"]["bias"]
  np.testing.assert_allclose(code, jax.nn.sigmoid(jnp.einsum("bqhd,bkhd->bhqk", q, k)
                                                  / np.sqrt(D)), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(module.apply({"params": params}, x), out, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(hypernetwork.hypernetwork_attention(module, params, x), out,
                             rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(hypernetwork.latent_code(module, params, x), code,
                             rtol=1e-5, atol=1e-6)
  ours = nnx_attention.MultiHeadAttention(H, E, H * D, attention="new_norm", rngs=nnx.Rngs(0))
  nnx_attention.load_params(ours, params)
  np.testing.assert_allclose(ours(x), out, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("preset", ["new_norm", "new_value"])
def test_modules_refuse_a_fast_path_that_does_not_compute_the_name(new_names, preset):
  del new_names
  x = _inputs()
  new = NORMALIZATION if preset == "new_norm" else VALUE_NETWORK
  params = _linen_params(_linen(preset), x)  # `init` materializes: the reference.
  module = _linen(preset, implementation="blockwise")
  _refused(lambda: module.apply({"params": params}, x), "blockwise", new)
  ours = nnx_attention.MultiHeadAttention(H, E, H * D, attention=preset,
                                          implementation="blockwise", rngs=nnx.Rngs(0))
  _refused(lambda: ours(x), "blockwise", new)


def test_hypernetwork_form_refuses_a_new_value_network(new_names):
  """The modules compute it (the reference); its generated weights are not written, so the
  explicit form and everything reading weights through it refuse."""
  del new_names
  module, x = _linen("new_value"), _inputs()
  params = _linen_params(module, x)
  out = module.apply({"params": params}, x)
  code = hypernetwork.latent_code(module, params, x)
  value = jnp.einsum("bte,ehv->bthv", x, params["value"]["kernel"]) + params["value"]["bias"]
  y_BQHV = jnp.tanh(jnp.einsum("bhqk,bkhv->bqhv", code, value))
  expected = jnp.einsum("bqhv,hvo->bqo", y_BQHV, params["out"]["kernel"]) + params["out"]["bias"]
  np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
  _refused(lambda: hypernetwork.hypernetwork_attention(module, params, x), VALUE_NETWORK)
  _refused(lambda: hypernetwork.generate_value_network(module, params, code), VALUE_NETWORK)
  _refused(lambda: hypernetwork.pair_weights(module, params, x, jnp.array([1]),
                                             jnp.array([0])), VALUE_NETWORK)


def test_probing_weight_reader_refuses_a_new_value_network(new_names):
  del new_names
  config = tl.smoke("fuzzy_logic")
  objective = objectives.build(config)
  model_config = build.transformer_config(
      {k: v for k, v in config.model.items() if v is not None} | {"attention": "new_value"},
      **objective.model_overrides)
  model = transformer.Transformer(model_config)
  inputs = objective.encode(objective.task.sample(jax.random.key(0), 2, "test"))[0]
  params = nn.meta.unbox(model.init(jax.random.key(0), inputs)["params"])
  run = types.SimpleNamespace(config=config, objective=objective, model=model, params=params)
  _refused(lambda: weights.generated_weights(run, num_problems=4), VALUE_NETWORK)


def test_unknown_names_are_refused_in_one_line():
  """Names in no registry: each entry refuses them before computing anything."""
  query, key, value = _operands()
  for kwargs, name in ((dict(normalization="rms_heads"), "rms_heads"),
                       (dict(value_network="mlpp"), "mlpp"),
                       (dict(activation="rellu"), "rellu"),
                       (dict(implementation="blockwize"), "blockwize")):
    _refused(lambda kw=kwargs: dispatch.attention(query, key, value, **kw), name)
  x = _inputs()
  _refused(lambda: _linen("hyla", position="alibi").init(jax.random.key(0), x), "alibi")
  _refused(lambda: _linen("hyla2").init(jax.random.key(0), x), "hyla2")
  module = _linen("hyla")
  params = _linen_params(module, x)
  _refused(lambda: hypernetwork.latent_code(module.clone(position="alibi"), params, x),
           "alibi")
  _refused(lambda: nnx_attention.MultiHeadAttention(H, E, position="alibi",
                                                    rngs=nnx.Rngs(0)), "alibi")


def test_declared_model_names_are_the_modules_own():
  """`presets.py` declares the names the launching machine checks without JAX; each has its
  runner, kernel or class."""
  assert set(presets.IMPLEMENTATIONS) == {"auto", "reference", *dispatch.FAST_PATHS,
                                          *dispatch.EXPLICIT_PATHS}
  x = _inputs()
  for name, class_name in presets.FEED_FORWARDS.items():
    layer = feed_forward.layer(name, hidden_dim=4, num_experts=3, top_k=2)
    assert type(layer).__name__ == class_name
    assert layer.apply(layer.init(jax.random.key(0), x), x).shape == x.shape


def test_a_feed_forward_name_without_a_class_is_refused(monkeypatch):
  """A name added to `presets.FEED_FORWARDS` alone: the model refuses it in one line (the
  block's last branch once built it as a MoE)."""
  monkeypatch.setitem(presets.FEED_FORWARDS, "geglu", "GeGlu")
  model = transformer.Transformer(transformer.TransformerConfig(
      num_layers=1, emb_dim=E, num_heads=H, qk_dim=H * D, v_dim=H * D, mlp_dim=4,
      feed_forward="geglu"))
  with pytest.raises(ValueError, match=r"^feed_forward 'geglu' maps to 'GeGlu', which is no "
                                       r"class of feed_forward.py."):
    model.init(jax.random.key(0), _inputs())


def test_an_implementation_declared_without_a_runner_is_refused(monkeypatch):
  """`presets.IMPLEMENTATIONS` is the one list dispatch checks: a name added there alone
  reaches dispatch's runners, and is refused there in one line."""
  monkeypatch.setattr(presets, "IMPLEMENTATIONS", (*presets.IMPLEMENTATIONS, "fused"))
  with pytest.raises(ValueError, match=r"^dispatch has no runner for implementation='fused'."):
    dispatch.attention(*_operands(), implementation="fused")


def test_probing_paths_refuse_an_unknown_implementation():
  """The materializing path (Linen with mutable intermediates, NNX with `sow_weights`) runs
  no implementation, but a name no path runs is refused there too, as on the fast path."""
  x = _inputs()
  module = _linen("hyla", implementation="foo")
  params = _linen_params(_linen("hyla"), x)
  for mutable in (False, ["intermediates"]):
    _refused(lambda m=mutable: module.apply({"params": params}, x, mutable=m), "foo")
  ours = nnx_attention.MultiHeadAttention(H, E, H * D, implementation="foo", rngs=nnx.Rngs(0))
  for sow_weights in (False, True):
    _refused(lambda s=sow_weights: ours(x, sow_weights=s), "foo")


def test_hypernetwork_form_reads_the_one_value_network_table(monkeypatch):
  """The explicit form checks `attention.VALUE_NETWORKS`, not a list of its own: a network
  dropped from that table is refused here too, and one in it whose weights are not written
  is refused in one line, not computed as an MLP."""
  module, x = _linen("hyla"), _inputs()
  params = _linen_params(module, x)
  monkeypatch.setattr(attention, "VALUE_NETWORKS", ("linear", "nonlinear_value"))
  _refused(lambda: hypernetwork.hypernetwork_attention(module, params, x), "mlp")
  monkeypatch.setattr(attention, "VALUE_NETWORKS", (*attention.VALUE_NETWORKS, VALUE_NETWORK))
  monkeypatch.setitem(presets.PRESETS, "new_value",
                      presets.AttentionPreset("rms_head", VALUE_NETWORK, "tanh"))
  code = hypernetwork.latent_code(module, params, x)
  for call in (lambda: hypernetwork.generate_value_network(_linen("new_value"), params, code),
               lambda: hypernetwork.apply_value_network(_linen("new_value"), params,
                                                 {"W2": jnp.zeros((B, T, T, 1))}, x)):
    with pytest.raises(errors.BadInput, match=rf"^value_network '{VALUE_NETWORK}' has no "
                                              "explicit hypernetwork form yet; allowed: "):
      call()

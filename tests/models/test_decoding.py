"""Decode-cache generation (`decoding.py`) against the full forward pass, and the LM's
attention path (the blockwise kernel, never the materialized reference)."""

import jax
import numpy as np
import pytest

from hypernet_attention import decoding
from hypernet_attention import transformer
from hypernet_attention.ops import reference

import train_testlib as tl

VOCAB, T = 37, 12


def _lm(attention, **changes):
  config = transformer.TransformerConfig(
      num_layers=2, emb_dim=32, num_heads=4, qk_dim=32, v_dim=32, mlp_dim=64,
      attention=attention, input_kind="embed", vocab_size=VOCAB, output_dim=VOCAB,
      position="rope", causal=True, attention_dropout=0.0, max_len=T)
  config = config.replace(**changes)
  return config, tl.token_model_params(config, seq_len=T, seed=1)


def _tokens(batch=3, length=T):
  return jax.random.randint(jax.random.PRNGKey(5), (batch, length), 0, VOCAB)


@pytest.mark.parametrize("attention", ["softmax", "linear", "hyla"])
def test_cached_decoding_equals_the_full_forward_pass(attention):
  config, params = _lm(attention)
  tokens_BT = _tokens()
  full_BTV = transformer.Transformer(config).apply({"params": params}, tokens_BT)
  cached_BTV = decoding.decode_logits(config, params, tokens_BT)
  # Same function, different float32 summation order (one query at a time).
  np.testing.assert_allclose(cached_BTV, full_BTV, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("attention", ["softmax", "hyla"])
def test_greedy_sampling_continues_the_prompt_with_full_pass_argmaxes(attention):
  config, params = _lm(attention)
  prompt_BP = _tokens(batch=2, length=4)
  out_BT = np.asarray(decoding.sample(config, params, prompt_BP, num_tokens=T - 4,
                                      rng=jax.random.PRNGKey(0), temperature=0.0))
  np.testing.assert_array_equal(out_BT[:, :4], prompt_BP)
  # Causal: the full pass over the output gives at t-1 the logits that chose token t.
  logits_BTV = transformer.Transformer(config).apply({"params": params}, out_BT)
  np.testing.assert_array_equal(out_BT[:, 4:], np.argmax(logits_BTV[:, 3:-1], -1))
  sampled = decoding.sample(config, params, prompt_BP, num_tokens=T - 4,
                            rng=jax.random.PRNGKey(0), temperature=1.0)
  assert sampled.shape == out_BT.shape and (np.asarray(sampled) < VOCAB).all()


def test_sampling_refuses_more_positions_than_max_len():
  config, params = _lm("softmax")
  with pytest.raises(ValueError, match="at most max_len=12"):
    decoding.sample(config, params, _tokens(length=4), num_tokens=T, rng=jax.random.PRNGKey(0))


@pytest.mark.parametrize("attention", ["linear", "hyla"])
def test_lm_training_pass_never_materializes_the_reference(attention, monkeypatch):
  length = 64  # Well above dispatch.REFERENCE_MAX_PAIRS.
  config, params = _lm(attention, max_len=length)

  def refuse(*args, **kwargs):
    raise AssertionError("the (B, Q, K, V) reference ran")

  monkeypatch.setattr(reference, "attention", refuse)
  monkeypatch.setattr(reference, "apply_value_network", refuse)
  model = transformer.Transformer(config)
  tokens_BT = _tokens(batch=2, length=length)

  def loss(params):
    return model.apply({"params": params}, tokens_BT, deterministic=False).sum()

  jax.grad(loss)(params)

"""Autoregressive decoding of a causal `Transformer` with the attention key/value cache.

Shape letters: B batch, T positions (prompt + generated), P prompt length, V vocabulary.

Each step feeds one token through `Transformer(config.replace(decode=True))`, whose attention
modules append that token's key and value to the `cache` collection and attend to the cache (see
`attention.place_heads`), so a step costs O(T) instead of re-running the O(T^2) prefix. Prompt
tokens are fed the same way (teacher forcing), so `decode_logits` of a whole sequence equals the
full forward pass: the test that the cache is right.

The language models here read inputs shifted right with BOS = 0 (seqio's convention), so a
prompt starts with token 0."""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp

from hypernet_attention import errors
from hypernet_attention import transformer


def _decode_model(config: transformer.TransformerConfig) -> transformer.Transformer:
  if not config.causal or config.input_kind != "embed":
    raise ValueError(f"decoding needs causal=True and input_kind='embed'; got causal="
                     f"{config.causal}, input_kind={config.input_kind!r}.")
  return transformer.Transformer(config.replace(decode=True))


def init_cache(config: transformer.TransformerConfig, batch_size: int, length: int) -> Any:
  """An empty cache for `batch_size` sequences of up to `length` tokens."""
  if config.max_len is not None and length > config.max_len:
    raise ValueError(f"decoding {length} positions; allowed: at most max_len={config.max_len}.")
  model = _decode_model(config)
  shapes = jax.eval_shape(lambda: model.init(
      jax.random.PRNGKey(0), jnp.zeros((batch_size, length), jnp.int32))["cache"])
  return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)


def _step(model, params, cache, token_B):
  logits_B1V, variables = model.apply(
      {"params": params, "cache": cache}, token_B[:, None], mutable=["cache"])
  return variables["cache"], logits_B1V[:, 0].astype(jnp.float32)


def decode_logits(config: transformer.TransformerConfig, params: Any,
                  tokens_BT: jax.Array) -> jax.Array:
  """(B, T, V) logits of `tokens_BT` computed one position at a time through the cache."""
  model = _decode_model(config)
  cache = init_cache(config, *tokens_BT.shape)
  _, logits_TBV = jax.lax.scan(functools.partial(_step, model, params), cache, tokens_BT.T)
  return logits_TBV.transpose(1, 0, 2)


def check_sampling(*, num_tokens: Any, temperature: Any, prompt: str = "") -> None:
  """`BadInput` naming the first sampling argument that cannot work (before any work)."""
  if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or num_tokens < 1:
    raise errors.BadInput(f"--num_tokens={num_tokens!r}; allowed: an integer >= 1")
  if (isinstance(temperature, bool) or not isinstance(temperature, (int, float))
      or not 0 <= temperature < math.inf):
    raise errors.BadInput(f"--temperature={temperature!r}; allowed: a finite number >= 0 "
                          "(0: greedy)")
  if not isinstance(prompt, str):
    raise errors.BadInput(f"--prompt={prompt!r}; allowed: a string")


def check_prompt_length(prompt_tokens: int, max_len: int | None) -> None:
  """`BadInput` when a prompt of `prompt_tokens` (BOS included) leaves no position to sample."""
  if max_len is not None and prompt_tokens >= max_len:
    raise errors.BadInput(
        f"--prompt of {prompt_tokens} tokens (with BOS) leaves no room to sample; allowed: "
        f"a prompt of fewer than the model's max_len={max_len} tokens")


def sample(config: transformer.TransformerConfig, params: Any, prompt_BP: jax.Array,
           num_tokens: int, rng: jax.Array, temperature: float = 1.0) -> jax.Array:
  """(B, P + num_tokens) tokens: the prompt followed by samples (temperature 0: greedy)."""
  check_sampling(num_tokens=num_tokens, temperature=temperature)
  batch, prompt_len = prompt_BP.shape
  total = prompt_len + num_tokens
  model = _decode_model(config)
  tokens_BT = jnp.zeros((batch, total), jnp.int32).at[:, :prompt_len].set(prompt_BP)

  def body(carry, t):
    cache, tokens_BT = carry
    cache, logits_BV = _step(model, params, cache, tokens_BT[:, t])
    if temperature == 0:
      chosen_B = jnp.argmax(logits_BV, -1)
    else:
      chosen_B = jax.random.categorical(jax.random.fold_in(rng, t), logits_BV / temperature)
    # Inside the prompt the next token is given; after it, the sample is kept.
    next_B = jnp.where(t + 1 < prompt_len, tokens_BT[:, t + 1], chosen_B.astype(jnp.int32))
    return (cache, tokens_BT.at[:, t + 1].set(next_B)), None

  (_, tokens_BT), _ = jax.lax.scan(
      body, (init_cache(config, batch, total), tokens_BT), jnp.arange(total - 1))
  return tokens_BT


def sample_text(config: transformer.TransformerConfig, params: Any, vocabulary: Any,
                prompt: str, num_tokens: int, *, temperature: float = 1.0, seed: int = 0,
                num_samples: int = 1) -> list[str]:
  """`num_samples` texts: `prompt` and its sampled continuation, decoded together (so the
  word boundary between them is kept); `vocabulary` has seqio's encode / decode / eos_id.
  At most `config.max_len` positions in all; a sample ends at its first EOS."""
  prompt_ids = [0] + list(vocabulary.encode(prompt))  # BOS = 0, as in training.
  if config.max_len is not None:
    check_prompt_length(len(prompt_ids), config.max_len)
    num_tokens = min(num_tokens, config.max_len - len(prompt_ids))
  tokens_BT = jax.device_get(sample(
      config, params, jnp.asarray([prompt_ids] * num_samples, jnp.int32), num_tokens,
      jax.random.PRNGKey(seed), temperature))
  texts = []
  for row in tokens_BT[:, 1:].tolist():
    if vocabulary.eos_id in row[len(prompt_ids) - 1:]:
      row = row[:row.index(vocabulary.eos_id, len(prompt_ids) - 1)]
    texts.append(vocabulary.decode(row))
  return texts

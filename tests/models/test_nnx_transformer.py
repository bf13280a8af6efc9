"""experiments/nnx_transformer.py at smoke size: both attentions train and report."""

import math

from flax import nnx
import jax
import jax.numpy as jnp

from experiments import nnx_transformer
from hypernet_attention import nnx_attention


def test_both_attentions_train_at_smoke_size(capsys):
  results = nnx_transformer.main(
      ["--steps=40", "--width=8", "--heads=2", "--depth=1", "--batch=16"])
  assert [r.attention for r in results] == ["softmax", "hyla"]
  for r in results:
    assert all(math.isfinite(v) for v in r[1:]), r
    assert r.train_loss < r.first_loss, r  # 40 Adam steps lower the regression loss
  printed = capsys.readouterr().out
  assert "hyla" in printed and "step time HYLA / softmax" in printed


def test_only_the_attention_line_differs():
  softmax = nnx_transformer.Transformer("softmax", 5, 8, 2, 1, rngs=nnx.Rngs(0))
  hyla = nnx_transformer.Transformer("hyla", 5, 8, 2, 1, rngs=nnx.Rngs(0))
  assert type(softmax.blocks[0].attention) is nnx.MultiHeadAttention
  assert type(hyla.blocks[0].attention) is nnx_attention.MultiHeadAttention
  shapes = [jax.tree.map(jnp.shape, nnx.to_pure_dict(nnx.state(m, nnx.Param)))
            for m in (softmax, hyla)]
  assert shapes[0] == shapes[1]  # same parameters, names and shapes

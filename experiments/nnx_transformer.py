r"""HYLA in your own Flax NNX model: a small transformer on fuzzy-logic regression (Fig. 2).

  python experiments/nnx_transformer.py            # 300 steps each, a few minutes on CPU
  python experiments/nnx_transformer.py --steps=50 --width=16

Trains the same transformer twice with `nnx.Optimizer`, once with Flax's own
`nnx.MultiHeadAttention` and once with `nnx_attention.MultiHeadAttention(attention="hyla")`
swapped in (the only line that differs), and prints per variant the final train loss, R^2
on fresh sequences of the training tasks (`test`) and of held-out task combinations (`ood`,
the paper's OOD R^2), and the mean train-step time. It is written as Flax's NNX examples
write a model, without the project's training stack; `experiments/fuzzy_logic.py` is the
paper's setup (its sizes, T5 positions, dropout, schedules)."""

from __future__ import annotations

import time
from typing import NamedTuple

from flax import nnx
import jax
import jax.numpy as jnp
import optax

from hypernet_attention import errors
from hypernet_attention import nnx_attention
from hypernet_attention.tasks import fuzzy_logic

ATTENTIONS = ("softmax", "hyla")


class Block(nnx.Module):
  """Pre-norm transformer block: attention, then a GeLU MLP, each with a residual."""

  def __init__(self, kind: str, width: int, heads: int, *, rngs: nnx.Rngs):
    self.attention_norm = nnx.LayerNorm(width, rngs=rngs)
    self.attention = (  # The one line that differs: Flax's attention, or HYLA's drop-in.
        nnx.MultiHeadAttention(heads, width, decode=False, rngs=rngs) if kind == "softmax"
        else nnx_attention.MultiHeadAttention(heads, width, attention=kind, rngs=rngs))
    self.mlp_norm = nnx.LayerNorm(width, rngs=rngs)
    self.mlp_in = nnx.Linear(width, 4 * width, rngs=rngs)
    self.mlp_out = nnx.Linear(4 * width, width, rngs=rngs)

  def __call__(self, x_BTE: jax.Array) -> jax.Array:
    x_BTE = x_BTE + self.attention(self.attention_norm(x_BTE))
    return x_BTE + self.mlp_out(nnx.gelu(self.mlp_in(self.mlp_norm(x_BTE))))


class Transformer(nnx.Module):
  """Tokens (B, T, F) -> the regression output read at the last (query) token, (B,)."""

  def __init__(self, kind: str, features: int, width: int, heads: int, depth: int, *,
               rngs: nnx.Rngs):
    self.embed = nnx.Linear(features, width, rngs=rngs)
    self.blocks = nnx.List([Block(kind, width, heads, rngs=rngs) for _ in range(depth)])
    self.norm = nnx.LayerNorm(width, rngs=rngs)
    self.head = nnx.Linear(width, 1, rngs=rngs)

  def __call__(self, tokens_BTF: jax.Array) -> jax.Array:
    x_BTE = self.embed(tokens_BTF)
    for block in self.blocks:
      x_BTE = block(x_BTE)
    return self.head(self.norm(x_BTE[:, -1]))[:, 0]


class Result(NamedTuple):
  attention: str
  first_loss: float
  train_loss: float
  test_r2: float
  ood_r2: float
  step_seconds: float


@nnx.jit
def train_step(model: Transformer, optimizer: nnx.Optimizer, tokens, target):
  def loss_fn(model):
    return jnp.mean((model(tokens) - target) ** 2)

  loss, grads = nnx.value_and_grad(loss_fn)(model)
  optimizer.update(model, grads)
  return loss


@nnx.jit
def predict(model: Transformer, tokens):
  return model(tokens)


def train(kind: str, task: fuzzy_logic.FuzzyLogic, *, steps: int, batch: int, width: int,
          heads: int, depth: int, learning_rate: float, seed: int = 0) -> Result:
  """Trains one variant; the step time is the mean over steps after the first (compile)."""
  model = Transformer(kind, task.num_variables + 1, width, heads, depth, rngs=nnx.Rngs(seed))
  optimizer = nnx.Optimizer(model, optax.adam(learning_rate), wrt=nnx.Param)
  key = jax.random.key(seed)
  start = None
  for step in range(steps):
    tokens, target = task.encode(task.sample(jax.random.fold_in(key, step), batch, "train"))
    loss = train_step(model, optimizer, tokens, target)
    if step == 0:
      first_loss = float(loss)
      start = time.perf_counter()
  loss = float(loss)
  step_seconds = (time.perf_counter() - start) / max(steps - 1, 1)

  def r2(split):
    sample = task.sample(jax.random.fold_in(key, steps), 4 * batch, split)  # unseen
    return float(jnp.mean(task.r2_per_sequence(predict(model, task.encode(sample)[0]), sample)))

  return Result(kind, first_loss, loss, r2("test"), r2("ood"), step_seconds)


def main(argv=None) -> list[Result]:
  parser = errors.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--steps", type=int, default=300)
  parser.add_argument("--batch", type=int, default=64)
  parser.add_argument("--width", type=int, default=32)
  parser.add_argument("--heads", type=int, default=4)
  parser.add_argument("--depth", type=int, default=2)
  parser.add_argument("--learning_rate", type=float, default=3e-3)
  args = parser.parse_args(argv)
  task = fuzzy_logic.FuzzyLogic()
  results = []
  for kind in ATTENTIONS:
    results.append(train(kind, task, steps=args.steps, batch=args.batch, width=args.width,
                         heads=args.heads, depth=args.depth, learning_rate=args.learning_rate))
    r = results[-1]
    print(f"{kind:8s} train loss {r.first_loss:.4f} -> {r.train_loss:.4f}  R^2 test "
          f"{r.test_r2:.3f}  ood {r.ood_r2:.3f}  {1e3 * r.step_seconds:.1f} ms/step", flush=True)
  print(f"step time HYLA / softmax: {results[1].step_seconds / results[0].step_seconds:.2f}")
  return results


if __name__ == "__main__":
  main()

"""Demonstration of the core: equivalence per preset, parameter counts, a timing.

  python experiments/demo_equivalence.py [--batch 128] [--steps 5]

Prints, for every attention preset, the max abs difference (float64) between `MultiHeadAttention`,
its explicit hypernetwork form (`hypernetwork.py`) and the paper's equations written here as
einsums; the parameter counts of the paper's fuzzy-logic (151,009) and SRAVEN width-1 depth-4
(402,824) models; and the time of a jitted forward+backward pass of the SRAVEN model at batch 128.
"""

import time

import jax

jax.config.update("jax_enable_x64", True)

import flax.linen as nn  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from hypernet_attention import attention  # noqa: E402
from hypernet_attention import errors  # noqa: E402
from hypernet_attention import hypernetwork  # noqa: E402
from hypernet_attention import presets  # noqa: E402
from hypernet_attention import transformer  # noqa: E402
from hypernet_attention.train import state as state_lib  # noqa: E402

PHI = {"relu": lambda x: np.maximum(x, 0), "identity": lambda x: x}


def paper_einsums(p, x, mask, preset, eps=1e-6):
  """The paper's Eqs. 2-7 in numpy einsums (no position bias; causal+padding mask)."""
  p = jax.tree.map(np.asarray, p)
  q, k, v = (np.einsum("bte,ehd->bthd", x, p[n]["kernel"]) + p[n]["bias"]
             for n in ("query", "key", "value"))
  s = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
  if preset.normalization == "softmax":
    e = np.where(mask, np.exp(s - s.max(-1, keepdims=True)), 0)
    a = e / e.sum(-1, keepdims=True)
  else:
    a = np.where(mask, s, 0)
    if preset.normalization == "rms_head":
      a = a / np.sqrt((a**2).mean(1, keepdims=True) + eps)
  phi = PHI[preset.activation]
  if preset.value_network == "linear":
    y = np.einsum("bhqk,bkhv->bqhv", a, v)
  elif preset.value_network == "nonlinear_value":
    y = np.einsum("bhqk,bkhv->bqhv", a, phi(v))
  else:
    z = phi(np.einsum("bhqk,bkhv->bqkv", a, v))
    if preset.value_network == "deep_mlp":
      z = phi(np.einsum("bhqk,bqkv,hvw->bqkw", a, z, p["value_hidden"]))
    y = np.einsum("bhqk,bqkv->bqhv", a, z)
  return np.einsum("bqhv,hvo->bqo", y, p["out"]["kernel"]) + p["out"]["bias"]


def equivalence_errors():
  x = jax.random.normal(jax.random.PRNGKey(0), (4, 12, 16), jnp.float64)
  padding = np.ones((4, 1, 1, 12), bool)
  padding[1:, ..., -3:] = False
  mask = np.logical_and(padding, np.tril(np.ones((12, 12), bool)))
  print(f"{'preset':32s} {'norm':9s} {'value net':16s} {'phi':9s} "
        f"{'|mha-hyper|':>11s} {'|mha-eqs|':>11s}")
  for name, preset in presets.PRESETS.items():
    module = attention.MultiHeadAttention(
        num_heads=4, attention=name, qk_features=16, v_features=16,
        dtype=jnp.float64, param_dtype=jnp.float64)
    params = nn.meta.unbox(module.init(jax.random.PRNGKey(1), x)["params"])
    params = jax.tree.map(lambda a: a + 0.1, params)  # non-zero biases
    mha = np.asarray(module.apply({"params": params}, x, mask=padding, is_causal=True))
    hyper = np.asarray(hypernetwork.hypernetwork_attention(
        module, params, x, mask=jnp.asarray(padding), is_causal=True))
    eqs = paper_einsums(params, np.asarray(x), mask, preset)
    print(f"{name:32s} {preset.normalization:9s} {preset.value_network:16s} {preset.activation:9s} "
          f"{np.abs(mha - hyper).max():11.2e} {np.abs(mha - eqs).max():11.2e}")
  print("(softmax's fast path is jax.nn.dot_product_attention, which keeps float32 "
        "internals even for float64 inputs: hence ~1e-7 there.)")


def parameter_counts():
  print("\nparameters (paper: fuzzy logic 151,009; SRAVEN width 1 depth 4 402,824)")
  for name in ("softmax", "linear", "hyla", "hyla_deep"):
    counts = []
    for config, shape in ((transformer.fuzzy_logic_config(16, attention=name), (1, 16, 5)),
                          (transformer.sraven_config(attention=name), (1, 36, 8))):
      model = transformer.Transformer(config)
      abstract = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), jnp.zeros(shape)))  # noqa: B023
      counts.append(state_lib.count_params(abstract["params"]))
    print(f"  {name:10s} fuzzy logic {counts[0]:9,d}   SRAVEN {counts[1]:9,d}")


def timing(batch, steps):
  print(f"\nSRAVEN width 1 depth 4, jitted forward+backward, batch {batch}, float32, "
        f"{jax.default_backend()}")
  jax.config.update("jax_enable_x64", False)
  x = jax.random.normal(jax.random.PRNGKey(0), (batch, 36, 8))
  for name in ("softmax", "linear", "hyla"):
    model = transformer.Transformer(transformer.sraven_config(attention=name))
    params = model.init(jax.random.PRNGKey(1), x[:1])["params"]

    @jax.jit
    def grad_fn(p, rng):
      loss = lambda p: jnp.mean(model.apply({"params": p}, x, deterministic=False,  # noqa: B023
                                            rngs={"dropout": rng}) ** 2)
      return jax.value_and_grad(loss)(p)

    jax.block_until_ready(grad_fn(params, jax.random.PRNGKey(0)))  # compile
    start = time.perf_counter()
    for i in range(steps):
      jax.block_until_ready(grad_fn(params, jax.random.PRNGKey(i)))
    print(f"  {name:8s} {(time.perf_counter() - start) / steps * 1e3:8.1f} ms/step")


def main():
  parser = errors.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batch", type=int, default=128)
  parser.add_argument("--steps", type=int, default=5)
  args = parser.parse_args()
  equivalence_errors()
  parameter_counts()
  timing(args.batch, args.steps)


if __name__ == "__main__":
  main()

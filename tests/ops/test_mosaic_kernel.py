"""The Mosaic GPU HYLA kernels (ops/mosaic_kernel.py, ops/mosaic_kernel_bwd.py) in Pallas's GPU
interpret mode, on the CPU.

Interpret mode runs the kernels' own programs (TMA copies, barriers, wgmmas, SMEM stores) on
the CPU, simulating shared memory per program; with `detect_races=True` it prints "RACE
DETECTED" on a read of SMEM that a pending copy or another thread may still write, which the
tests below turn into a failure. It needs jax >= 0.11 (which needs Python >= 3.12): on
Python 3.11 / jax 0.10.2 this module skips, and CI's Python 3.12 leg (jax 0.11.2) runs it.
Interpretation is slow (every key of every tile is a dozen simulated wgmmas and SMEM
accesses; the backward ~80 ms per key and query tile), so the cases are few and small: B=1,
H=8, T=64 plain and T=128 causal with a padding mask (two query tiles, so the backward's
skipped causal tiles are exercised), a batch of two with per-example masks at a length no
tile divides, and H=4 at T=72 (each key tile sums dK and dV over two query tiles, one mostly
padding); the dQ kernel alone against a float64 matmul, with NaN where it must not read; the
registers forward (ops/mosaic_forward_registers.py), output only, at three shapes. The lot
takes ~5 minutes on a 2-core CPU.

Tolerance: tests/numerics.py's rule (errors relative to the float64 reference, bounded by
what the float32 reference's own rounding admits for this input's reductions). In interpret
mode the wgmmas are float32 matmuls (numpy), so the float32 kernels differ from the
reference only by summation order; the permutation and broadcast wgmmas multiply by 0/1 and
add no rounding. Gradients go through the custom VJP, i.e. the backward kernel (dK, dV on
chip) and its XLA matmul (dQ), and are held to the same rule as the output.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hypernet_attention.ops import mosaic_forward_registers
from hypernet_attention.ops import mosaic_kernel
from hypernet_attention.ops import mosaic_smem
from hypernet_attention.ops import reference

from numerics import compare
from numerics import error_bound
from numerics import float64_value_and_grads
from numerics import reduction_length
from numerics import rel_err
from numerics import value_and_grads

_WHY_NOT = mosaic_kernel.available()
pytestmark = pytest.mark.skipif(
    _WHY_NOT is not None,
    reason=f"{_WHY_NOT}: Mosaic GPU interpret mode needs jax >= 0.11 on Python >= 3.12; CI's "
           "Python 3.12 leg (jax 0.11.2) runs these tests")


def _interpret():
  from jax.experimental.pallas import mosaic_gpu as plgpu  # pylint: disable=g-import-not-at-top
  return plgpu.InterpretGPUParams(detect_races=True)


def _inputs(batch, length, heads=8, depth=32, v_dim=16, seed=0):
  keys = jax.random.split(jax.random.key(seed), 4)
  q = jax.random.normal(keys[0], (batch, length, heads, depth), jnp.float32)
  k = jax.random.normal(keys[1], (batch, length, heads, depth), jnp.float32)
  v = jax.random.normal(keys[2], (batch, length, heads, v_dim), jnp.float32)
  cot = jax.random.normal(keys[3], (batch, length, heads, v_dim), jnp.float32)
  return q, k, v, None, None, cot


def _reference_fn(mask, causal):
  def fn(q, k, v, bias):
    del bias
    full = mask
    if causal:
      causal_QK = jnp.tril(jnp.ones((q.shape[1], k.shape[1]), bool))
      full = causal_QK if mask is None else jnp.logical_and(mask, causal_QK)
    return reference.attention(q, k, v, mask=full, normalization="rms_head",
                               value_network="mlp", activation="relu")
  return fn


def _kernel_fn(mask, causal, blocks, dq=None):
  return lambda q, k, v, bias: mosaic_kernel.attention(
      q, k, v, mask=mask, is_causal=causal, blocks=blocks, interpret=_interpret(), dq=dq)


def _padding_mask(valid_lengths, length):
  """(B, 1, 1, K): True for the first valid_lengths[b] keys of example b."""
  return (jnp.arange(length)[None, :] < jnp.asarray(valid_lengths)[:, None])[:, None, None, :]


@pytest.mark.parametrize("batch,length,heads,causal,valid,block_k,dq", [
    (1, 64, 8, False, None, 16, "kernel"),   # the dQ kernel's key tiles: 64
    (1, 128, 8, True, (100,), 32, "kernel"),  # 64, stopping at the diagonal
    # 40 pads to 64 queries, 48 keys (dQ key tiles of 16); one mask per example.
    (2, 40, 8, False, (40, 23), 16, "kernel"),
    # Every key tile sums dK and dV over two query tiles, the second half padding; the last
    # key tile is half padding; H = 4 gives S_cat and the dS scatter another width.
    (1, 72, 4, False, None, 16, "kernel"),
    # XLA's dQ reads all of dS: the key tile at 64 writes zeros for query tile 0.
    (1, 72, 4, True, None, 16, "xla"),
])
def test_interpret_matches_reference(batch, length, heads, causal, valid, block_k, dq, capsys):
  inputs = _inputs(batch, length, heads=heads)
  mask = None if valid is None else _padding_mask(valid, length)
  blocks = mosaic_kernel.Blocks(block_q=64, block_k=block_k, block_v=16)
  errors = compare(_kernel_fn(mask, causal, blocks, dq), _reference_fn(mask, causal), inputs)
  assert "RACE DETECTED" not in capsys.readouterr().out
  for name, (err, bound) in errors.items():
    assert err < bound, f"{name}: relative error {err:.3g} >= bound {bound:.3g}"
  # The margin that makes the rule meaningful: a kernel that ignored the mask or the causal
  # flag would be off by O(0.1), while the bounds here are ~1e-3.
  assert max(bound for _, bound in errors.values()) < 1e-2


@pytest.mark.parametrize("batch,length,heads,causal,valid,block_k,block_v,v_dim", [
    (1, 64, 8, False, None, 16, 4, 16),
    (1, 128, 8, True, (100,), 32, 2, 16),  # two query tiles, stopping at the diagonal
    # H=3, 8 keys and 2 columns per tile: V ring slots pad to 4 heads (128 bytes in
    # float32); V=10 pads to 12; one mask per example; 40 queries pad to 64.
    (2, 40, 3, False, (40, 23), 8, 2, 10),
])
def test_registers_forward_matches_reference(batch, length, heads, causal, valid, block_k,
                                             block_v, v_dim, capsys):
  """forward="registers" (ops/mosaic_forward_registers.py), its output against the float64
  reference under the rule above. Output only: its gradients are the backward kernel's,
  which the custom VJP runs from the inputs whichever forward ran (tested above)."""
  q, k, v, _, _, cot = _inputs(batch, length, heads=heads, v_dim=v_dim)
  mask = None if valid is None else _padding_mask(valid, length)
  blocks = mosaic_kernel.Blocks(64, block_k, block_v)
  got = jax.jit(lambda q, k, v: mosaic_kernel.attention(
      q, k, v, mask=mask, is_causal=causal, blocks=blocks, interpret=_interpret(),
      forward="registers"))(q, k, v)
  assert "RACE DETECTED" not in capsys.readouterr().out
  ref = _reference_fn(mask, causal)
  exact, _ = float64_value_and_grads(ref, q, k, v, None, cot)
  ref32, _ = value_and_grads(ref, q, k, v, None, cot)
  bound = error_bound(rel_err(ref32, exact), reduction_length(q, k, v), jnp.float32)
  assert rel_err(got, exact) < bound < 1e-2


def test_ignoring_the_mask_would_fail():
  """The checks above can fail: the same inputs with the mask left out are far off, in the
  output and in every gradient (the backward sees the mask only through the scores)."""
  inputs = _inputs(1, 64)
  mask = _padding_mask((40,), 64)
  errors = compare(_kernel_fn(None, False, mosaic_kernel.DEFAULT_BLOCKS),
                   _reference_fn(mask, False), inputs)
  for name in ("out", "dq", "dk", "dv"):
    err, bound = errors[name]
    assert err > 100 * bound, (name, err, bound)


@pytest.mark.parametrize("k_padded,causal", [(96, True), (80, False)])
def test_dq_kernel_is_ds_times_k(k_padded, causal, capsys):
  """The query-stationary dQ kernel alone, against a float64 matmul: key tiles of 32 (Kp = 96)
  and 16 (Kp = 80). Causal, the dS tiles past each query tile's diagonal are NaN: the
  key-stationary kernel leaves them unwritten, so reading one would show."""
  from hypernet_attention.ops import mosaic_kernel_bwd  # pylint: disable=g-import-not-at-top
  keys = jax.random.split(jax.random.key(1), 2)
  ds_BHQK = jax.random.normal(keys[0], (1, 2, 128, k_padded), jnp.float32)
  k_BHKW = jax.random.normal(keys[1], (1, 2, k_padded, 64), jnp.float32)
  q_pos, k_pos = jnp.arange(128)[:, None], jnp.arange(k_padded)[None, :]
  read = k_pos < (q_pos // 64 + 1) * 64 if causal else jnp.ones((128, k_padded), bool)
  dq_BHQW = mosaic_kernel_bwd.DQ_PATHS["kernel"](
      jnp.where(read, ds_BHQK, jnp.nan), k_BHKW, is_causal=causal, interpret=_interpret())
  assert "RACE DETECTED" not in capsys.readouterr().out
  exact = np.einsum("bhqk,bhkw->bhqw", np.where(read, ds_BHQK, 0.0).astype(np.float64),
                    np.asarray(k_BHKW, np.float64))
  # One float32 dot of length Kp per entry: error ~ sqrt(Kp) * 2^-24 relative.
  np.testing.assert_allclose(dq_BHQW, exact, rtol=1e-5, atol=1e-5 * np.abs(exact).max())


@pytest.mark.parametrize("dtype,with_backward,forward", [
    (jnp.bfloat16, True, "wgmma"), (jnp.float16, False, "wgmma"),
    (jnp.bfloat16, False, "registers")])
def test_lowers_for_hopper_and_meets_its_memory_rules(dtype, with_backward, forward):
  """Pallas -> Mosaic GPU lowering, layout inference, TMA descriptors and the SMEM budget run
  at lowering time, for an abstract H100 (compute capability 9.0); only PTX needs the GPU.
  H=8, D=V=64: the forward takes ~214 KiB of SMEM, the backward 225 KiB and its dQ kernel 40.
  A batch of two: with one, Mosaic drops the unit batch axis from every TMA copy, and copies
  of 6 strided dimensions (over its limit of 5) lowered here and failed on the H100 window of
  2026-11-26 at B=4. While it lowers, every TMA copy, TMA descriptor and wgmma operand is
  checked against Hopper's alignment and size rules (`measure/hopper_rules.py`): what
  lowering and interpret mode accept but the H100 faulted on (2026-11-27). The backward (16
  keys unrolled) takes ~40 s to lower on a 2-core CPU, so it is lowered once, in bf16 (f16
  has the same layouts)."""
  from hypernet_attention.measure import hopper_rules  # pylint: disable=g-import-not-at-top
  q = jax.ShapeDtypeStruct((2, 128, 8, 64), dtype)
  fn = lambda q, k, v: mosaic_kernel.attention(q, k, v, is_causal=True, forward=forward)
  if with_backward:
    fn = jax.value_and_grad(lambda *a: mosaic_kernel.attention(*a, is_causal=True).astype(
        jnp.float32).sum(), argnums=(0, 1, 2))
  uses = hopper_rules.uses(fn, q, q, q)
  assert [hopper_rules.describe(u) for u in uses if not u.ok] == []
  # Forward: Q, P, B, and K, V, key validity (two prologue slots and the prefetch); the
  # output. The backward adds its kernels' copies: each is checked, none skipped.
  kinds = {u.what for u in uses}
  assert {"TMA load", "TMA store", "TMA descriptor", "wgmma A", "wgmma B"} <= kinds
  # The registers forward: Q; K, V, key validity (prologue and prefetch); no P or B.
  assert sum(u.what == "TMA load" for u in uses) >= (
      10 if forward == "registers" else 12 if not with_backward else 40)


def test_the_memory_rules_catch_a_planted_misaligned_slot(monkeypatch):
  """The fault of the H100 window of 2026-11-27, planted back: a key-validity ring of
  64-byte slots (block_k = 16 floats), so slot 1's TMA destination is 64 bytes off the 128
  that `cp.async.bulk.tensor` needs. Lowering and interpret mode accept it; the check names
  it, once per copy into the ring's dynamically indexed slot (the prologue's slot 1 and the
  prefetch's)."""
  from hypernet_attention.measure import hopper_rules  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(mosaic_smem, "key_valid_slot", lambda block_k: block_k)
  q = jax.ShapeDtypeStruct((2, 128, 8, 64), jnp.bfloat16)
  bad = hopper_rules.violations(
      lambda q, k, v: mosaic_kernel.attention(q, k, v, is_causal=True), q, q, q)
  assert len(bad) == 2, [hopper_rules.describe(u) for u in bad]
  for use in bad:
    assert use.what == "TMA load" and "16xf32" in use.smem_type
    assert "alignment 64 bytes, needs 128" in hopper_rules.describe(use)


def test_refuses_what_it_does_not_compute():
  q = jnp.zeros((1, 64, 8, 32))
  with pytest.raises(ValueError, match="HYLA only"):
    mosaic_kernel.attention(q, q, q, normalization="softmax")
  with pytest.raises(ValueError, match="HYLA only"):
    mosaic_kernel.attention(q, q, q, mask=jnp.ones((1, 1, 64, 64), bool))
  with pytest.raises(ValueError, match="dq='cudnn'; allowed: kernel, xla"):
    mosaic_kernel.attention(q, q, q, dq="cudnn")
  with pytest.raises(ValueError, match="forward='vpu'; allowed: wgmma, registers"):
    mosaic_kernel.attention(q, q, q, forward="vpu")
  with pytest.raises(ValueError, match="block_v of 8"):
    mosaic_kernel.attention(q, q, q, blocks=mosaic_kernel.Blocks(64, 16, 4))
  with pytest.raises(ValueError, match="at most 16 heads"):
    mosaic_kernel.attention(jnp.zeros((1, 64, 17, 32)), jnp.zeros((1, 64, 17, 32)),
                            jnp.zeros((1, 64, 17, 32)))
  assert mosaic_kernel.supports("rms_head", "mlp", "relu", mask=jnp.ones((2, 1, 1, 64), bool))


@pytest.mark.parametrize("blocks,heads,depth,dtype,says", [
    # 8 bf16 keys are 16-byte rows of S_cat: Mosaic swizzles 32, 64 or 128 bytes only.
    (mosaic_kernel.Blocks(64, 8, 16), 8, 64, jnp.bfloat16, "S_cat .* 16-byte rows"),
    (mosaic_kernel.Blocks(64, 16, 32), 8, 64, jnp.bfloat16, "at least 256,256 bytes"),
    (mosaic_kernel.Blocks(128, 16, 16), 8, 64, jnp.bfloat16, "at least 319,744 bytes"),
    (mosaic_kernel.DEFAULT_BLOCKS, 8, 64, jnp.float32, "shared memory"),
])
def test_compiled_refuses_tiles_that_do_not_fit(blocks, heads, depth, dtype, says):
  """Compiled (interpret=None), tiles Mosaic cannot take are one BadInput line before any
  lowering; the same tiles still run in interpret mode (the tests above use block_k=32)."""
  q = jnp.zeros((1, 64, heads, depth), dtype)
  with pytest.raises(ValueError, match=says) as refusal:
    mosaic_kernel.attention(q, q, q, blocks=blocks)
  assert "\n" not in str(refusal.value)


def test_the_default_tiles_fit_forward_and_backward():
  """What the GPU window runs passes the check (H=8, D=V=64, bf16); H=16 does not fit the
  backward (its P and S_cat grow with H), as lowering says (410,680 bytes)."""
  from hypernet_attention.ops import mosaic_kernel_bwd  # pylint: disable=g-import-not-at-top
  mosaic_smem.check_tiles(
      mosaic_kernel.forward_smem(mosaic_kernel.DEFAULT_BLOCKS, 8, 64, jnp.bfloat16), "fwd")
  mosaic_smem.check_tiles(mosaic_kernel_bwd.backward_smem(8, 64, jnp.bfloat16), "bwd")
  with pytest.raises(ValueError, match="at least 407,616 bytes"):
    mosaic_smem.check_tiles(mosaic_kernel_bwd.backward_smem(16, 64, jnp.bfloat16), "bwd")


@pytest.mark.parametrize("blocks,forward", [
    (mosaic_kernel.Blocks(64, 16, 32), "wgmma"), (mosaic_kernel.Blocks(128, 16, 16), "wgmma"),
    (mosaic_kernel.Blocks(256, 64, 4), "registers")])
def test_smem_budget_is_a_tight_lower_bound_of_mosaics(blocks, forward, monkeypatch):
  """The check's sum against Mosaic's own count: lowering the forward for an abstract H100
  with the check switched off fails with "smem_bytes=N > max_smem_bytes=232448"; the sum must
  not exceed N (else it could refuse tiles that fit) and be within 4 KiB of it (barriers and
  alignment), and the limit must be Mosaic's."""
  import re  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(mosaic_smem, "check_tiles", lambda buffers, what: None)
  q = jax.ShapeDtypeStruct((2, 128, 8, 64), jnp.bfloat16)
  from hypernet_attention.measure import hopper_rules  # pylint: disable=g-import-not-at-top
  fn = lambda q, k, v: mosaic_kernel.attention(q, k, v, is_causal=True, blocks=blocks,
                                               forward=forward)
  mesh = hopper_rules.abstract_h100_mesh()
  with jax.sharding.use_abstract_mesh(mesh), pytest.raises(Exception) as failure:
    jax.jit(fn).trace(q, q, q).lower(lowering_platforms=("cuda",))
  found = re.search(r"smem_bytes=(\d+) > max_smem_bytes=(\d+)", str(failure.value))
  assert found, str(failure.value)[:300]
  mosaics, limit = int(found.group(1)), int(found.group(2))
  buffers = (mosaic_forward_registers.smem if forward == "registers" else
             mosaic_kernel.forward_smem)(blocks, 8, 64, jnp.bfloat16)
  ours = sum(b.nbytes for b in buffers)
  assert ours <= mosaics <= ours + 4096
  assert limit == mosaic_smem.HOPPER_SMEM_BYTES

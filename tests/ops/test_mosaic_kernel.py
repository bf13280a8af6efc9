"""The Mosaic GPU HYLA kernels (ops/mosaic_kernel.py, ops/mosaic_kernel_bwd.py) in Pallas's GPU
interpret mode, on the CPU.

Interpret mode runs the kernels' own programs (TMA copies, barriers, wgmmas, SMEM stores) on
the CPU, simulating shared memory per program; with `detect_races=True` it prints "RACE
DETECTED" on a read of SMEM that a pending copy or another thread may still write, which the
tests below turn into a failure. It needs jax >= 0.11 (which needs Python >= 3.12): on
Python 3.11 / jax 0.10.2 this module skips, and CI's Python 3.12 leg (jax 0.11.2) runs it.
Interpretation is slow, so the cases are few and small: B=1, H=8, T=64 plain and T=128
causal with a padding mask (two query tiles, so the causal tiles the backward skips are
exercised), a batch of two with per-example masks at a length no tile divides, H=4 at T=72
through XLA's matmuls, and H=3 with V=10 (padded heads and columns); the dS kernel on two
warpgroups (`Blocks.ds_two_warpgroups`) at T=128 and, split, at T=72; the dQ and dK matmul
kernels alone against float64, with NaN where they must not read. The lot takes ~5 minutes
on a 2-core CPU.

Tolerance: tests/numerics.py's rule (errors relative to the float64 reference, bounded by
what the float32 reference's own rounding admits for this input's reductions). In interpret
mode the wgmmas are float32 matmuls (numpy), so the float32 kernels differ from the
reference only by summation order. Gradients go through the custom VJP, i.e. the backward's
kernels, and are held to the same rule as the output.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hypernet_attention.ops import mosaic_kernel
from hypernet_attention.ops import mosaic_smem
from hypernet_attention.ops import reference

from numerics import compare

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


PLAIN = mosaic_kernel.Blocks(64, 8, 4, paired=False)
TWO_WARPGROUP_DS = mosaic_kernel.Blocks(ds_two_warpgroups=True)


@pytest.mark.parametrize("batch,length,heads,causal,valid,blocks,dq,v_dim", [
    # The plain forward (one value column per accumulator).
    (1, 64, 8, False, None, PLAIN, "kernel", 16),
    # Two query tiles, stopping at the diagonal; the dV kernel's second key tile starts at
    # query tile 8 of 8 rows; 16-key forward tiles.
    (1, 128, 8, True, (100,), mosaic_kernel.Blocks(64, 16, 2, paired=False), "kernel", 16),
    # The default forward, two value columns per accumulator (Blocks.paired): the code's key
    # pairs exchanged in registers, V laid out as v_mix and v_swap by XLA. 40 pads to 64
    # queries and keys, one mask per example; two query tiles and a padded mask.
    (2, 40, 8, False, (40, 23), mosaic_kernel.DEFAULT_BLOCKS, "kernel", 16),
    (1, 128, 8, True, (100,), mosaic_kernel.DEFAULT_BLOCKS, "kernel", 16),
    # XLA's matmuls read all of dS: the dS kernel writes zeros past the diagonal.
    (1, 72, 4, True, None, mosaic_kernel.DEFAULT_BLOCKS, "xla", 16),
    # H=3: V ring slots pad to 4 heads (128 bytes in float32); V=10 pads to 16 (the forward's
    # 8-column slices) and 12 (the dV kernel's 4).
    (1, 72, 3, True, None, mosaic_kernel.DEFAULT_BLOCKS, "kernel", 10),
    # The dS kernel on two warpgroups, alternating key tiles (8 of the second query tile's 16).
    (1, 128, 8, True, (100,), TWO_WARPGROUP_DS, "kernel", 16),
])
def test_interpret_matches_reference(batch, length, heads, causal, valid, blocks, dq, v_dim,
                                     capsys):
  """Output and gradients (the custom VJP: the dS, dV and matmul kernels) against the
  float64 reference under the rule above."""
  inputs = _inputs(batch, length, heads=heads, v_dim=v_dim)
  mask = None if valid is None else _padding_mask(valid, length)
  errors = compare(_kernel_fn(mask, causal, blocks, dq),
                   _reference_fn(mask, causal), inputs)
  assert "RACE DETECTED" not in capsys.readouterr().out
  for name, (err, bound) in errors.items():
    assert err < bound, f"{name}: relative error {err:.3g} >= bound {bound:.3g}"
  # The margin that makes the rule meaningful: a kernel that ignored the mask or the causal
  # flag would be off by O(0.1), while the bounds here are ~1e-3.
  assert max(bound for _, bound in errors.values()) < 1e-2


@pytest.mark.parametrize("dq", ["kernel", "xla"])
def test_causal_keys_past_the_last_query(dq, capsys):
  """Causal with more keys than queries (query i sees keys <= i): keys 40-135 are seen by no
  query, so their dK and dV are 0. The dV program of key tile 128 and the dK matmul's programs
  of key tiles 64 and 128 start past the last query tile (a negative trip count, which must run
  no step and read no query tile); the forward and dS stop at the diagonal as usual."""
  q, k, v, _, _, cot = _inputs(1, 136)
  inputs = (q[:, :40], k, v, None, None, cot[:, :40])
  errors = compare(_kernel_fn(None, True, mosaic_kernel.DEFAULT_BLOCKS, dq),
                   _reference_fn(None, True), inputs)
  assert "RACE DETECTED" not in capsys.readouterr().out
  for name, (err, bound) in errors.items():
    assert err < bound, f"{name}: relative error {err:.3g} >= bound {bound:.3g}"


@pytest.mark.parametrize("length,heads,valid,dq,blocks", [
    (128, 8, (100,), "kernel", mosaic_kernel.DEFAULT_BLOCKS),
    (72, 4, None, "xla", mosaic_kernel.DEFAULT_BLOCKS),
    (72, 4, None, "xla", TWO_WARPGROUP_DS)])
def test_ds_kernel_split_over_keys_matches_reference(length, heads, valid, dq, blocks,
                                                     monkeypatch, capsys):
  """The dS kernel's keys split over programs (DS_SPLIT_KEYS, 512 on hardware) at 16 keys, so that
  these lengths run several programs per query tile, some past the causal diagonal with nothing to
  do; through XLA's matmuls those write zeros over their own keys only. On two warpgroups, a
  program's second warpgroup has one key tile or none."""
  from hypernet_attention.ops import mosaic_kernel_bwd  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(mosaic_kernel_bwd, "DS_SPLIT_KEYS", 16)
  inputs = _inputs(1, length, heads=heads)
  mask = None if valid is None else _padding_mask(valid, length)
  errors = compare(_kernel_fn(mask, True, blocks, dq), _reference_fn(mask, True), inputs)
  assert "RACE DETECTED" not in capsys.readouterr().out
  for name, (err, bound) in errors.items():
    assert err < bound, f"{name}: relative error {err:.3g} >= bound {bound:.3g}"


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


def test_a_masked_nonfinite_key_or_value_contributes_nothing(capsys):
  """Issue 67: a NaN key at padding (key 7 of 8) and an Inf value in the future of queries 0-4
  (key 5, causal). The outputs of queries 0-4 and the gradients of a loss on them equal the
  same call with those entries zeroed (the kernels' 0 x value of a masked pair saw NaN there),
  and queries 5-7, which see key 5, come out non-finite."""
  q, k, v, _, _, _ = _inputs(1, 8, heads=2, depth=16, v_dim=4)
  fn = _kernel_fn(_padding_mask((7,), 8), True, mosaic_kernel.Blocks(64, 8, 2))

  def loss(q, k, v):
    out = fn(q, k, v, None)
    return jnp.sum(out[:, :5] * jnp.linspace(-1.0, 1.0, out[:, :5].size).reshape(
        out[:, :5].shape)), out

  run = jax.jit(jax.value_and_grad(loss, (0, 1, 2), has_aux=True))
  k, v = k.at[:, 7].set(0.0), v.at[:, 5].set(0.0)
  (_, out), grads = run(q, k.at[:, 7].set(jnp.nan), v.at[:, 5].set(jnp.inf))
  (_, want), want_grads = run(q, k, v)
  assert "RACE DETECTED" not in capsys.readouterr().out
  for name, got, expected in zip(("out", "dq", "dk", "dv"), (out[:, :5], *grads),
                                 (want[:, :5], *want_grads)):
    assert np.isfinite(got).all(), f"{name} is not finite"
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6, err_msg=name)
  assert not np.isfinite(out[:, 5:]).all(axis=(0, 2, 3)).any()


def test_the_profilers_rung_runs_forward_and_backward_unchecked():
  """`mosaic_rungs fwd_bwd`, the program the GPU window runs under ncu: every kernel of one
  fwd+bwd, finite, with no float64 reference (it would not fit at T=4096)."""
  from hypernet_attention.measure import mosaic_rungs  # pylint: disable=g-import-not-at-top
  row = mosaic_rungs.run_rung("fwd_bwd", batch=1, seq_len=64, heads=2, head_dim=16)
  assert row["status"] == "pass" and row["mode"] == "interpret", row
  assert "max_rel_err" not in row


@pytest.mark.parametrize("k_padded,causal", [(128, True), (192, False)])
def test_ds_matmul_kernels(k_padded, causal, capsys):
  """dQ = dS K and dK = dS^T Q by the matmul kernels alone, against float64 matmuls, at 128
  queries. Causal, the dS tiles past each query tile's diagonal are NaN: the dS kernel leaves
  them unwritten, so reading one would show in both."""
  from hypernet_attention.ops import mosaic_kernel_bwd  # pylint: disable=g-import-not-at-top
  keys = jax.random.split(jax.random.key(1), 3)
  ds_BHQK = jax.random.normal(keys[0], (1, 2, 128, k_padded), jnp.float32)
  q_BHQD = jax.random.normal(keys[1], (1, 2, 128, 64), jnp.float32)
  k_BHKD = jax.random.normal(keys[2], (1, 2, k_padded, 64), jnp.float32)
  q_pos, k_pos = jnp.arange(128)[:, None], jnp.arange(k_padded)[None, :]
  read = k_pos < (q_pos // 64 + 1) * 64 if causal else jnp.ones((128, k_padded), bool)
  dq_BHQD, dk_BHKD = mosaic_kernel_bwd.DQ_PATHS["kernel"](
      jnp.where(read, ds_BHQK, jnp.nan), q_BHQD, k_BHKD, is_causal=causal,
      interpret=_interpret())
  assert "RACE DETECTED" not in capsys.readouterr().out
  ds64 = np.where(read, ds_BHQK, 0.0).astype(np.float64)
  for got, exact in ((dq_BHQD, np.einsum("bhqk,bhkd->bhqd", ds64, np.float64(k_BHKD))),
                     (dk_BHKD, np.einsum("bhqk,bhqd->bhkd", ds64, np.float64(q_BHQD)))):
    # One float32 dot of length <= 192 per entry: error ~ sqrt(n) * 2^-24 relative.
    np.testing.assert_allclose(got, exact, rtol=1e-5, atol=1e-5 * np.abs(exact).max())


@pytest.mark.parametrize("dtype,with_backward,schedule", [
    (jnp.bfloat16, True, {}), (jnp.bfloat16, True, {"ds_two_warpgroups": True}),
    (jnp.float16, False, {}),
    (jnp.bfloat16, False, {"paired": False, "block_v": 4})])
def test_lowers_for_hopper_and_meets_its_memory_rules(dtype, with_backward, schedule):
  """Pallas -> Mosaic GPU lowering, layout inference, TMA descriptors and the SMEM budget run
  at lowering time, for an abstract H100 (compute capability 9.0); only PTX needs the GPU.
  H=8, D=V=64. A batch of two: with one, Mosaic drops the unit batch axis from every TMA
  copy, and copies of 6 strided dimensions (over its limit of 5) lowered here and failed on
  the H100 window of 2026-11-26 at B=4. While it lowers, every TMA copy, TMA descriptor and
  wgmma operand is checked against Hopper's alignment and size rules
  (`measure/hopper_rules.py`): what lowering and interpret mode accept but the H100 faulted
  on (2026-11-27). The backward lowers in ~15 s on a 2-core CPU. The default (paired) forward's
  register exchange (inline Mosaic GPU, which interpret mode cannot run) lowers here."""
  from hypernet_attention.measure import hopper_rules  # pylint: disable=g-import-not-at-top
  q = jax.ShapeDtypeStruct((2, 128, 8, 64), dtype)
  blocks = mosaic_kernel.Blocks(**schedule)
  forward = lambda q, k, v: mosaic_kernel.attention(q, k, v, is_causal=True, blocks=blocks)
  fn = jax.value_and_grad(lambda *a: forward(*a).astype(jnp.float32).sum(), argnums=(0, 1, 2)
                          ) if with_backward else forward
  uses = hopper_rules.uses(fn, q, q, q)
  assert [hopper_rules.describe(u) for u in uses if not u.ok] == []
  kinds = {u.what for u in uses}
  assert {"TMA load", "TMA store", "TMA descriptor", "wgmma A", "wgmma B"} <= kinds
  # Forward: Q; K, V, key validity (two prologue slots and the prefetch). The backward adds
  # its kernels' copies (dS: 11, dV: 9, each matmul: 6): each is checked, none skipped.
  assert sum(u.what == "TMA load" for u in uses) == (42 if with_backward else 10)


def test_the_memory_rules_catch_a_planted_misaligned_slot(monkeypatch):
  """The fault of the H100 window of 2026-11-27, planted back: a key-validity ring of
  unaligned slots (block_k = 8 floats, 32 bytes), so slot 1's TMA destination is 32 bytes
  off the 128 that `cp.async.bulk.tensor` needs. Lowering and interpret mode accept it; the
  check names it, once per copy into the ring's dynamically indexed slot (the prologue's
  slot 1 and the prefetch's)."""
  from hypernet_attention.measure import hopper_rules  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(mosaic_smem, "key_valid_slot", lambda block_k: block_k)
  q = jax.ShapeDtypeStruct((2, 128, 8, 64), jnp.bfloat16)
  bad = hopper_rules.violations(
      lambda q, k, v: mosaic_kernel.attention(q, k, v, is_causal=True), q, q, q)
  assert len(bad) == 2, [hopper_rules.describe(u) for u in bad]
  for use in bad:
    assert use.what == "TMA load" and "8xf32" in use.smem_type
    assert "alignment 32 bytes, needs 128" in hopper_rules.describe(use)


def test_refuses_what_it_does_not_compute():
  q = jnp.zeros((1, 64, 8, 32))
  with pytest.raises(ValueError, match="HYLA only"):
    mosaic_kernel.attention(q, q, q, normalization="softmax")
  with pytest.raises(ValueError, match="HYLA only"):
    mosaic_kernel.attention(q, q, q, mask=jnp.ones((1, 1, 64, 64), bool))
  with pytest.raises(ValueError, match="dq='cudnn'; allowed: kernel, xla"):
    mosaic_kernel.attention(q, q, q, dq="cudnn")
  with pytest.raises(ValueError, match="block_k of 8"):
    mosaic_kernel.attention(q, q, q, blocks=mosaic_kernel.Blocks(64, 12, 4))
  with pytest.raises(ValueError, match=r"block_v at least 1 \(even when paired\)"):
    mosaic_kernel.attention(q, q, q, blocks=mosaic_kernel.Blocks(64, 8, 3, paired=True))
  assert mosaic_kernel.supports("rms_head", "mlp", "relu", mask=jnp.ones((2, 1, 1, 64), bool))


@pytest.mark.parametrize("blocks,heads,depth,says", [
    # Q grows with bq: Q 256*8*64*2 + output 8*4*256*4 + K ring 2*8*8*64*2 + V ring (float32)
    # 2*8*4*8*4 + key validity 2*32*4 bytes.
    (mosaic_kernel.Blocks(256, 8, 4), 8, 64, "at least 313,600 bytes"),
    (mosaic_kernel.DEFAULT_BLOCKS, 8, 256, "at least 3.*Q 256 KiB"),  # and with D
])
def test_compiled_refuses_tiles_that_do_not_fit(blocks, heads, depth, says):
  """Compiled (interpret=None), tiles over Hopper's shared memory are one BadInput line
  before any lowering; the same tiles still run in interpret mode."""
  q = jnp.zeros((1, 64, heads, depth), jnp.bfloat16)
  with pytest.raises(ValueError, match=says) as refusal:
    mosaic_kernel.attention(q, q, q, blocks=blocks)
  assert "\n" not in str(refusal.value)


def test_the_default_tiles_fit_forward_and_backward():
  """What the GPU window runs passes the check (H=8, D=V=64, bf16); H=16 does not fit the
  backward's dS kernel (its Q, dY and V ring grow with H): Q 16*64*64*2 + dY 16*64*64*2 +
  K ring 2*16*8*64*2 + V ring (float32) 2*16*64*8*4 + key validity 2*32*4 + dS ring
  2*16*64*8*2 bytes; lowering's own count is within 4 KiB (the test below)."""
  from hypernet_attention.ops import mosaic_kernel_bwd  # pylint: disable=g-import-not-at-top
  mosaic_smem.check_tiles(
      mosaic_kernel.forward_smem(mosaic_kernel.DEFAULT_BLOCKS, 8, 64, jnp.bfloat16), "fwd")
  mosaic_kernel_bwd.check_tiles(8, 64, 64, jnp.bfloat16)
  with pytest.raises(ValueError, match="at least 393,472 bytes"):
    mosaic_kernel_bwd.check_tiles(16, 64, 64, jnp.bfloat16)
  # On two warpgroups: Q, dY and two rings each of K, V (bf16), key validity and dS, 229,888
  # bytes (Mosaic's own count: 230,400), which V in float32 would take to 262,656.
  mosaic_kernel_bwd.check_tiles(8, 64, 64, jnp.bfloat16, ds_warpgroups=2)
  buffers = mosaic_kernel_bwd.ds_smem(8, 64, 64, jnp.bfloat16, 2)
  v_ring = next(b for b in buffers if b.name == "V ring")
  assert v_ring.dtype == jnp.bfloat16 and sum(b.nbytes for b in buffers) == 229_888
  assert sum(b.nbytes for b in buffers) + v_ring.nbytes > mosaic_smem.HOPPER_SMEM_BYTES


@pytest.mark.parametrize("blocks,heads,with_backward", [
    (mosaic_kernel.Blocks(256, 64, 4), 8, False), (mosaic_kernel.DEFAULT_BLOCKS, 16, True)])
def test_smem_budget_is_a_tight_lower_bound_of_mosaics(blocks, heads, with_backward,
                                                      monkeypatch):
  """The check's sum against Mosaic's own count: lowering for an abstract H100 with the
  check switched off fails with "smem_bytes=N > max_smem_bytes=232448" (the forward at
  bq=256; at H=16 the backward's dS kernel); the sum must not exceed N (else it could refuse
  tiles that fit) and be within 4 KiB of it (barriers and alignment), and the limit must be
  Mosaic's."""
  import re  # pylint: disable=g-import-not-at-top

  from hypernet_attention.ops import mosaic_kernel_bwd  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(mosaic_smem, "check_tiles", lambda buffers, what: None)
  q = jax.ShapeDtypeStruct((2, 128, heads, 64), jnp.bfloat16)
  from hypernet_attention.measure import hopper_rules  # pylint: disable=g-import-not-at-top
  fn = lambda q, k, v: mosaic_kernel.attention(q, k, v, is_causal=True, blocks=blocks)
  buffers = mosaic_kernel.forward_smem(blocks, heads, 64, jnp.bfloat16)
  if with_backward:
    fn = jax.grad(lambda *a: mosaic_kernel.attention(*a, blocks=blocks).astype(
        jnp.float32).sum(), argnums=(0, 1, 2))
    buffers = mosaic_kernel_bwd.ds_smem(heads, 64, 64, jnp.bfloat16)
  mesh = hopper_rules.abstract_h100_mesh()
  with jax.sharding.use_abstract_mesh(mesh), pytest.raises(Exception) as failure:
    jax.jit(fn).trace(q, q, q).lower(lowering_platforms=("cuda",))
  found = re.search(r"smem_bytes=(\d+) > max_smem_bytes=(\d+)", str(failure.value))
  assert found, str(failure.value)[:300]
  mosaics, limit = int(found.group(1)), int(found.group(2))
  ours = sum(b.nbytes for b in buffers)
  assert ours <= mosaics <= ours + 4096
  assert limit == mosaic_smem.HOPPER_SMEM_BYTES

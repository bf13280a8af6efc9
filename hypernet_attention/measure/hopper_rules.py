"""Hopper's memory rules, checked on a Mosaic GPU kernel lowered for an abstract H100.

Why: a TMA copy or a wgmma whose shared-memory address breaks Hopper's alignment rules is not
an error at lowering time, nor in interpret mode; on the GPU it is
`CUDA_ERROR_MISALIGNED_ADDRESS`, which kills the process's CUDA context (the H200 window of
2026-11-27, its README). Everything the rules need is known when the kernel lowers, so they are
checked here, on a CPU, in CI.

How: while a function lowers (`uses(fn, *shapes)`), Mosaic's own `LaunchContext.async_copy`,
`LaunchContext._get_tma_desc` and `wgmma` are wrapped to record each TMA copy, each TMA
descriptor and each wgmma operand. A shared-memory address is the dynamic shared memory's base
(Mosaic aligns it to 1024 bytes) plus the static and dynamic offsets of the `memref.view` and
`memref.subview` ops it came from; its guaranteed alignment is the gcd of the base's, each
static byte offset and, for each dynamically indexed dimension, that dimension's byte stride.

The rules (CUDA driver API `cuTensorMapEncodeTiled`, PTX ISA `cp.async.bulk.tensor` and
`wgmma` matrix descriptors):
  TMA   the SMEM address aligned to 128 bytes, and to the swizzle's repeat (8 rows of the
        swizzle's width: 256, 512, 1024 bytes for 32-, 64-, 128-byte swizzles) when swizzled;
        at most 5 dimensions; every box dimension 1..256; the box's inner row a multiple of
        16 bytes and, swizzled, at most the swizzle's width; every global stride but the
        innermost a multiple of 16 bytes.
  wgmma each SMEM operand aligned to its swizzle's repeat (the descriptor's base-offset field
        is 0 in Mosaic's descriptors, which assumes it)."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import sys
from typing import Callable

import jax
from jax._src.lib.mlir import ir
from jax.experimental.mosaic import gpu as mgpu
from jax.experimental.mosaic.gpu import launch_context
from jax.experimental.mosaic.gpu import utils
import jax.numpy as jnp

from hypernet_attention.measure import benchmark
from hypernet_attention.ops import mosaic_kernel
from hypernet_attention.ops import mosaic_smem

SMEM_BASE_ALIGNMENT = 1024  # Mosaic GPU's dynamic shared memory base (SMEM_ALIGNMENT)
TMA_MAX_RANK = 5
TMA_MAX_BOX = 256
TMA_ROW_BYTES = 16


@dataclasses.dataclass(frozen=True)
class Use:
  """One use of shared memory or one TMA descriptor, with what Hopper requires of it."""
  what: str  # "TMA load", "TMA store", "TMA descriptor", "wgmma A", "wgmma B"
  smem_type: str  # the memref type as lowered (shape, layout)
  detail: str  # e.g. "alignment 64 bytes, needs 128"
  ok: bool


def _owner(value):
  owner = value.owner
  return getattr(owner, "operation", owner)


def _element_bytes(memref_type) -> int:
  return utils.bitwidth(memref_type.element_type) // 8


def smem_alignment(value) -> int:
  """Guaranteed byte alignment of a shared-memory memref's address (0 = unknown: refused)."""
  op = _owner(value)
  if not isinstance(op, ir.Operation):
    return 0
  name = op.name
  if name == "gpu.dynamic_shared_memory":
    return SMEM_BASE_ALIGNMENT
  if name == "memref.view":
    shift = _owner(op.operands[1])
    if isinstance(shift, ir.Operation) and shift.name == "arith.constant":
      return math.gcd(smem_alignment(op.operands[0]),
                      ir.IntegerAttr(shift.attributes["value"]).value)
    return 0
  if name == "memref.subview":
    source_type = ir.MemRefType(op.operands[0].type)
    strides, _ = source_type.get_strides_and_offset()
    element = _element_bytes(source_type)
    align = smem_alignment(op.operands[0])
    dynamic = ir.ShapedType.get_dynamic_stride_or_offset()
    for offset, stride in zip(op.attributes["static_offsets"], strides):
      step = stride * element if offset == dynamic else offset * stride * element
      align = math.gcd(align, step)
    return align
  if name in ("memref.cast", "memref.expand_shape", "memref.collapse_shape", "memref.transpose"):
    return smem_alignment(op.operands[0])
  if name == "memref.reinterpret_cast":
    offsets = list(op.attributes["static_offsets"])
    if offsets == [0]:  # the source's base pointer, no offset of its own
      return math.gcd(smem_alignment(op.operands[0]), SMEM_BASE_ALIGNMENT)
  return 0


def _swizzle_bytes(swizzle) -> int:
  """Mosaic passes swizzles as ints or as its dialect's SwizzlingMode (kNoSwizzle = 16)."""
  value = 0 if swizzle is None else int(swizzle)
  return 0 if value <= 16 else value


class _Recorder:
  """Wraps Mosaic's copy, descriptor and wgmma builders while a function lowers."""

  def __init__(self):
    self.uses: list[Use] = []

  def smem(self, what: str, ref, needed: int):
    align = smem_alignment(ref)
    self.uses.append(Use(what, str(ref.type), f"SMEM alignment {align or 'unknown'} bytes, "
                         f"needs {needed}", align != 0 and align % needed == 0))

  def copy(self, src_ref, dst_ref, swizzle):
    smem_ref, what = ((dst_ref, "TMA load") if "workgroup" in str(dst_ref.type)
                      else (src_ref, "TMA store"))
    repeat = 8 * _swizzle_bytes(swizzle)
    self.smem(what, smem_ref, max(mosaic_smem.TMA_SMEM_ALIGNMENT, repeat))

  def descriptor(self, gmem_ref, gmem_transform, box, swizzle):
    gmem_type = ir.MemRefType(gmem_ref.type)
    strides, _ = gmem_type.get_strides_and_offset()
    for t in gmem_transform:  # tiling, transposes; a transform that cannot say (dropping or
      try:                    # collapsing leading dims) keeps strides that are already there
        strides = t.transform_strides(strides)
      except NotImplementedError:
        pass
    element = _element_bytes(gmem_type)
    swizzle_bytes = _swizzle_bytes(swizzle)
    problems = []
    if len(box) > TMA_MAX_RANK:
      problems.append(f"{len(box)} dimensions > {TMA_MAX_RANK}")
    if any(not 1 <= b <= TMA_MAX_BOX for b in box):
      problems.append(f"a box dimension outside 1..{TMA_MAX_BOX}")
    row = box[-1] * element
    if row % TMA_ROW_BYTES:
      problems.append(f"box row {row} bytes, not a multiple of {TMA_ROW_BYTES}")
    if swizzle_bytes and row > swizzle_bytes:
      problems.append(f"box row {row} bytes > the {swizzle_bytes}-byte swizzle")
    bad_strides = [s * element for s in strides[:-1] if (s * element) % TMA_ROW_BYTES]
    if bad_strides:
      problems.append(f"global strides {bad_strides} bytes, not multiples of {TMA_ROW_BYTES}")
    self.uses.append(Use("TMA descriptor", str(gmem_type), f"box {tuple(box)}, strides "
                         f"{tuple(strides)} elements, swizzle {swizzle_bytes or 'none'}"
                         + (": " + "; ".join(problems) if problems else ""), not problems))

  def wgmma(self, a, b, swizzle):
    needed = 8 * _swizzle_bytes(swizzle)
    for what, ref in (("wgmma A", a), ("wgmma B", b)):
      if isinstance(ref, ir.Value) and "workgroup" in str(ref.type):
        self.smem(what, ref, needed)


@contextlib.contextmanager
def _recording():
  # The package's `wgmma` attribute is the function; the module of that name is sys.modules'.
  wgmma_module = sys.modules["jax.experimental.mosaic.gpu.wgmma"]
  recorder = _Recorder()
  context = launch_context.LaunchContext
  async_copy, get_tma_desc, wgmma = context.async_copy, context._get_tma_desc, mgpu.wgmma  # pylint: disable=protected-access

  def record_copy(self, *, src_ref, dst_ref, swizzle=None, **kwargs):
    recorder.copy(src_ref, dst_ref, swizzle)
    return async_copy(self, src_ref=src_ref, dst_ref=dst_ref, swizzle=swizzle, **kwargs)

  def record_descriptor(self, gmem_ref, gmem_transform, gmem_peer_id, box, swizzle, reduction_op):
    recorder.descriptor(gmem_ref, gmem_transform, box, swizzle)
    return get_tma_desc(self, gmem_ref, gmem_transform, gmem_peer_id, box, swizzle, reduction_op)

  def record_wgmma(acc, a, b, *, swizzle=128):
    recorder.wgmma(a, b, swizzle)
    return wgmma(acc, a, b, swizzle=swizzle)

  # Pallas's two lowerings reach wgmma through the package (Lane) and the module (Warpgroup).
  context.async_copy, context._get_tma_desc = record_copy, record_descriptor  # pylint: disable=protected-access
  mgpu.wgmma = wgmma_module.wgmma = record_wgmma
  try:
    yield recorder
  finally:
    context.async_copy, context._get_tma_desc = async_copy, get_tma_desc  # pylint: disable=protected-access
    mgpu.wgmma = wgmma_module.wgmma = wgmma


def abstract_h100_mesh():
  """A one-device mesh of an abstract H100 (compute capability 9.0): lowering for it needs
  no GPU."""
  return jax.sharding.AbstractMesh((1,), ("gpu",), abstract_device=jax.sharding.AbstractDevice(
      device_kind="NVIDIA H100", num_cores=132, platform="gpu"))


def uses(fn: Callable, *shapes) -> list[Use]:
  """Every TMA copy, TMA descriptor and wgmma SMEM operand of the Mosaic kernels that `fn`
  lowers to for an abstract H100, each judged against Hopper's rules. Lowering is fresh
  (jax's lowering cache would skip the recording), so this takes as long as lowering."""
  with _recording() as recorder, jax.sharding.use_abstract_mesh(abstract_h100_mesh()):
    jax.jit(lambda *args: fn(*args)).trace(*shapes).lower(lowering_platforms=("cuda",))
  if not recorder.uses:
    raise ValueError("hopper_rules: the function lowered to no Mosaic GPU copy or wgmma")
  return recorder.uses


def violations(fn: Callable, *shapes) -> list[Use]:
  """The uses that break a rule (empty: the kernels meet every rule checked here)."""
  return [u for u in uses(fn, *shapes) if not u.ok]


def describe(use: Use) -> str:
  return f"{use.what} of {use.smem_type}: {use.detail}"


def main() -> int:
  """`python -m hypernet_attention.measure.hopper_rules`: HYLA's Mosaic kernels (forward,
  backward, dQ; B=2, T=128, H=8, D=V=64, bf16, causal), one line per broken rule and a
  summary line; exit 1 on any."""

  shape = jax.ShapeDtypeStruct((2, 128, 8, 64), jnp.bfloat16)
  # With the loss's value: under grad alone the forward, its output unused, is not lowered.
  found = uses(benchmark.fwd_bwd(lambda q, k, v: mosaic_kernel.attention(q, k, v, is_causal=True)),
               shape, shape, shape)
  bad = [describe(u) for u in found if not u.ok]
  counts = ", ".join(f"{sum(u.what == k for u in found)} {k}" for k in sorted({u.what for u
                                                                             in found}))
  print("\n".join([*bad, f"hopper_rules: {len(found)} uses checked ({counts}): {len(bad)} "
                   "break a rule"]))
  return 1 if bad else 0


if __name__ == "__main__":
  raise SystemExit(main())

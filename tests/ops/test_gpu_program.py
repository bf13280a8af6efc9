"""`measure/gpu_program.py`: the kernels of a compiled GPU program, read from its HLO text.

The fixture (`compiled_gpu_module.hlo`, beside this file) is written in the form XLA:GPU
prints a compiled module (fusions calling fused computations, a while loop with a known trip
count, a cuBLAS call returning (result, workspace), an in-place slice update); the expected
counts and bytes are worked out by hand below, not by the code under test. Compiling needs
jax's CUDA plugin, which CI does not install: there the device refuses in one line, and that
refusal is what is tested."""

import pathlib

import pytest

from hypernet_attention.errors import BadInput
from hypernet_attention.measure import gpu_program

HLO = (pathlib.Path(__file__).parent / "compiled_gpu_module.hlo").read_text()


def test_kernels_counts_launches_bytes_and_layout_moves():
  by_name = {k.name: k for k in gpu_program.kernels(HLO)}
  # Entry: the transpose fusion (8x4 f32 = 128 bytes) and a layout copy, once each; the
  # loop body's three kernels and the condition's compare, 5 times each.
  assert set(by_name) == {"input_transpose_fusion", "copy.4", "custom-call.3",
                          "loop_dynamic_update_slice_fusion.2", "loop_add_fusion", "compare.7"}
  assert (by_name["input_transpose_fusion"].launches, by_name["input_transpose_fusion"]
          .bytes_written, by_name["input_transpose_fusion"].transposes) == (1, 128, True)
  assert by_name["copy.4"].transposes and by_name["copy.4"].launches == 1
  cublas = by_name["custom-call.3"]  # Its 32 MiB workspace is not written data.
  assert (cublas.family, cublas.launches, cublas.bytes_written) == (
      "__cublas$lt$matmul", 5, 64)
  update = by_name["loop_dynamic_update_slice_fusion.2"]  # The 2x8 update, not 16x8.
  assert (update.family, update.launches, update.bytes_written, update.transposes) == (
      "loop_dynamic_update_slice_fusion", 5, 64, False)
  assert by_name["compare.7"].launches == 5 and by_name["loop_add_fusion"].bytes_written == 4


def test_summary_totals_and_families():
  s = gpu_program.summary(gpu_program.kernels(HLO))
  assert s["launches"] == 1 + 1 + 5 * 4
  assert s["bytes_written"] == 128 + 128 + 5 * (64 + 64 + 4 + 1)
  assert (s["transpose_launches"], s["transpose_bytes"]) == (2, 256)
  assert [f["family"] for f in s["families"][:2]] == ["__cublas$lt$matmul",
                                                       "loop_dynamic_update_slice_fusion"]


def test_text_without_an_entry_is_refused():
  with pytest.raises(ValueError, match="no ENTRY computation"):
    gpu_program.kernels("%f (a: f32[]) -> f32[] {\n  ROOT %a = f32[] parameter(0)\n}\n")


def test_device_is_a_compile_only_h100_or_a_one_line_refusal():
  """With jax's CUDA plugin installed the target is an H100 (no GPU needed); without it (CI)
  the refusal names what to install. An unknown target is refused either way."""
  with pytest.raises(BadInput, match="GPU target 'a100'; allowed: h100"):
    gpu_program.device("a100")
  try:
    device = gpu_program.device("h100")
  except BadInput as e:
    assert "\n" not in str(e) and "pip install jax-cuda13-plugin==" in str(e)
  else:
    assert device.device_kind == "NVIDIA H100 80GB HBM3" and device.platform == "gpu"

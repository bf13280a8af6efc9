"""measure/ptxas.py: reading ptxas's report, and the refusal where jax's CUDA plugin is absent.

The compile itself (a compile-only H100 through jax's CUDA plugin, ~200 MB of wheels) runs in
no CI environment; what it reads is pinned here with ptxas 12.9's own words for a kernel of
this repository (the registers forward at Blocks(64, 16, 4), sm_90a)."""

import subprocess
import sys

import pytest

from hypernet_attention.measure import ptxas

import train_testlib as tl

SPILLING = """\
ptxas warning : Registers are spilled to local memory in function 'entry_mosaic_gpu_kernel', \
20 bytes spill stores, 20 bytes spill loads
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'entry_mosaic_gpu_kernel' for 'sm_90a'
ptxas info    : Function properties for entry_mosaic_gpu_kernel
    24 bytes stack frame, 20 bytes spill stores, 20 bytes spill loads
ptxas info    : Used 255 registers, used 2 barriers, 24 bytes cumulative stack size, 1 bytes smem
ptxas info    : Compile time = 689.596 ms
"""


def test_reads_registers_and_spills():
  assert ptxas.parse(SPILLING) == dict(registers=255, spill_stores=20, spill_loads=20)
  clean = SPILLING.replace("20 bytes spill stores, 20 bytes spill loads",
                           "0 bytes spill stores, 0 bytes spill loads").replace("255", "199")
  assert ptxas.parse(clean) == dict(registers=199, spill_stores=0, spill_loads=0)
  with pytest.raises(ValueError, match="not a ptxas report"):
    ptxas.parse("nvdisasm invocation failed")


def test_without_the_cuda_plugin_tune_kernels_says_what_to_install(tmp_path):
  """Where jax's CUDA plugin is not installed (CI), --ptxas is one line naming the wheels,
  before any output."""
  try:
    ptxas.device()
  except ValueError:
    pass
  else:
    pytest.skip("this environment has jax's CUDA plugin: the compile itself would run")
  result = subprocess.run(
      [sys.executable, "experiments/tune_kernels.py", "--ptxas",
       "--configs=mosaic:64x16x2:kernel", f"--out={tmp_path / 'rows.jsonl'}"],
      cwd=tl.REPO, env=tl.subprocess_env(), capture_output=True, text=True, timeout=300)
  assert result.returncode == 2 and result.stdout == ""
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1 and "jax-cuda12-plugin" in lines[0], result.stderr
  assert not (tmp_path / "rows.jsonl").exists()

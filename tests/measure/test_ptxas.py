"""measure/ptxas.py: reading ptxas's report, and the refusal where jax's CUDA plugin is absent.

The compile itself (a compile-only H100 through jax's CUDA plugin, ~200 MB of wheels) runs in
no CI environment; what it reads is pinned here with ptxas 12.9's own words for a kernel of
this repository (the registers forward at Blocks(64, 16, 4), sm_90a)."""

import json
import pathlib
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


def under_filled(kernels: dict[str, tuple[int, int, int]],
                 min_warps_per_scheduler: float) -> list[str]:
  """One line per kernel, {name: (registers, shared memory bytes, warps per CTA)}, whose
  `ptxas.occupancy` leaves a scheduler fewer warps than `min_warps_per_scheduler` (0 CTAs: it
  cannot launch at all)."""
  lines = []
  for name, (registers, smem_bytes, warps) in kernels.items():
    o = ptxas.occupancy(registers, smem_bytes, warps)
    if o.warps_per_scheduler < min_warps_per_scheduler:
      limit = "registers" if o.ctas_by_registers <= o.ctas_by_smem else "shared memory"
      lines.append(f"{name}: {o.warps_per_scheduler:g} warps per scheduler ({o.ctas} CTAs of "
                   f"{warps} warps per multiprocessor, bound by {limit}: {registers} registers, "
                   f"{smem_bytes:,} bytes); allowed: at least {min_warps_per_scheduler:g}")
  return lines


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


WINDOW = pathlib.Path(tl.REPO) / "experiments/results/gpu_windows/2026-11-28_h200/gpu_window.jsonl"
PTXAS_ROWS = pathlib.Path(tl.REPO) / "experiments/results/ptxas_h100.jsonl"


def _rows(path, kind=None):
  rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
  return [r for r in rows if kind is None or r.get("kind") == kind]


def test_occupancy_is_what_nsight_compute_measured_on_the_h200():
  """Each backward kernel's registers and shared memory, as the H200 launched them, give Nsight
  Compute's own CTA limits (by registers, by shared memory) and its measured warps per
  scheduler: dS 1 (bound by its 193 KiB), dV 2 (255 registers), dQ/dK 4.4-4.8 of 5."""
  seen = set()
  for row in _rows(WINDOW, "ncu"):
    m = row["metrics"]
    smem = m["launch__shared_mem_per_block_dynamic"] + m["launch__shared_mem_per_block_static"]
    got = ptxas.occupancy(int(m["launch__registers_per_thread"]), int(smem),
                          int(m["launch__block_size"]) // 32)
    assert got.ctas_by_registers == m["launch__occupancy_limit_registers"], row["kernel"]
    assert got.ctas_by_smem == m["launch__occupancy_limit_shared_mem"], row["kernel"]
    measured = m["smsp__warps_active.avg.per_cycle_active"]
    assert 0.85 * got.warps_per_scheduler <= measured <= got.warps_per_scheduler + 0.05
    seen.add(row["kernel"])
  assert seen == {"hyla_ds_mosaic_gpu_kernel", "hyla_dv_mosaic_gpu_kernel",
                  "hyla_dq_dk_mosaic_gpu_kernel"}


def _recorded(ds_two_warpgroups=False):
  """{kernel: (registers, shared memory bytes, warps per CTA)} of the newest ptxas rows of the
  default schedule (paired 64x8x8, dq=kernel), or with the dS kernel on two warpgroups, which carry
  Mosaic's shared memory (smem_bytes) and, since jax 0.12, the threads per CTA (else 128)."""
  return {row["kernel"]: (row["registers"], row["smem_bytes"], row.get("threads", 128) // 32)
          for row in _rows(PTXAS_ROWS) if row.get("paired") and row["block_v"] == 8
          and "smem_bytes" in row and row.get("ds_two_warpgroups", False) == ds_two_warpgroups}


def test_every_mosaic_kernel_launches_and_the_planted_over_budget_one_is_caught():
  """The check CI runs without a GPU or ptxas: recorded registers and shared memory (experiments/
  results/ptxas_h100.jsonl, which tune_kernels --ptxas writes). Every kernel fits one CTA per
  multiprocessor; at two warps per scheduler (issue 66's floor) the dS kernel is the one below
  (shared memory); a planted kernel over the budget (a 120 KiB dV: one CTA) is named."""
  table = _recorded()
  assert set(table) == {"forward", "dS", "dV", "dQ", "dK"}
  assert under_filled(table, 1) == []
  below = under_filled(table, 2)
  assert len(below) == 1 and below[0].startswith("dS: 1 warps per scheduler") and (
      "shared memory" in below[0]), below
  planted = dict(table, dV=(table["dV"][0], 120 * 1024, 4))
  assert [line.split(":")[0] for line in under_filled(planted, 2)] == ["dS", "dV"]
  too_big = dict(table, forward=(255, 240 * 1024, 4))
  assert under_filled(too_big, 1)[0].startswith("forward: 0 warps")


def test_the_two_warpgroup_ds_kernel_gives_each_scheduler_two_warps():
  """Issue 66's floor, met by ptxas's numbers of `Blocks.ds_two_warpgroups` (not yet run on a
  GPU): one CTA of 8 warps per multiprocessor, by shared memory (Q and dY shared, the V ring in
  bf16) and by registers, where the default's one CTA holds 4."""
  two = _recorded(ds_two_warpgroups=True)["dS"]
  assert two[2] == 8 and under_filled({"dS": two}, 2) == []
  assert ptxas.occupancy(*two).ctas == 1
  assert ptxas.occupancy(*_recorded()["dS"]).warps_per_scheduler == 1


def test_the_cost_models_ctas_per_sm_are_the_occupancy_of_the_kernels():
  from hypernet_attention.ops import kernel_cost  # pylint: disable=g-import-not-at-top
  table = _recorded()
  assert kernel_cost.CTAS_PER_SM == {name: ptxas.occupancy(*table[name]).ctas
                                     for name in kernel_cost.CTAS_PER_SM}


PTX = """\
.visible .entry k(
.param .u64 k_param_0
)
{
\tmov.u32 \t%r1, 0;
$L__BB0_1:
\tld.shared.f32 \t%f1, [%r2];
\tfma.rn.f32 \t%f2, %f1, %f1, %f2;
$L__BB0_2:
\tmbarrier.try_wait.parity.shared::cta.b64 \t%p1, [%r3], %r4;
\t@!%p1 bra \t$L__BB0_2;
$L__BB0_3:
\tfma.rn.f32 \t%f3, %f1, %f2, %f3;
\tfma.rn.f32 \t%f4, %f1, %f3, %f4;
\tmax.f32 \t%f5, %f4, 0f00000000;
\tadd.s32 \t%r5, %r5, 1;
\tsetp.lt.s32 \t%p2, %r5, 64;
\t@%p2 bra \t$L__BB0_3;
\tadd.s32 \t%r1, %r1, 1;
\tsetp.lt.s32 \t%p3, %r1, 8;
\t@%p3 bra.uni \t$L__BB0_1;
\tret;
}
"""


def test_the_hot_loop_is_the_one_whose_own_body_has_most_fmas():
  """A key loop holding a barrier's spin loop and a column loop: the column loop's own body (2 of
  its 6 instructions FMAs) is the hot one; the outer loop's own body, its inner loops left out,
  has one FMA; a PTX without a loop is refused."""
  assert ptxas.hot_loop(PTX) == dict(instructions=6, fma=2, ld_shared=0)
  flat = PTX.replace("\t@%p2 bra \t$L__BB0_3;\n", "")
  assert ptxas.hot_loop(flat)["fma"] == 3  # no column loop: all three in the key loop's body
  with pytest.raises(ValueError, match="no loop"):
    ptxas.hot_loop(".visible .entry k()\n{\n\tret;\n}\n")

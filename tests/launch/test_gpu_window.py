"""`launch/gpu_window.py --dry_run`: the GPU window's whole sequence at tiny sizes on the CPU,
and what its one JSON-lines file must hold for a window's numbers to be read off it."""

import json
import math
import os
import sys

import pytest

import train_testlib as tl

KINDS = ("window", "env", "rung", "parity", "c4_step", "tune", "stage", "window_end")


def _numbers(row):
  for value in row.values():
    if isinstance(value, float):
      yield value
    elif isinstance(value, dict):
      yield from _numbers(value)


@pytest.mark.slow
def test_dry_run_records_every_kind_of_result(tmp_path):
  out = tmp_path / "out"
  result = tl.run([sys.executable, "-m", "launch.gpu_window", "--dry_run", "--stages=all",
                           f"--out={out}", "--commit=test"], cwd=tl.REPO,
                          env=tl.subprocess_env(), capture_output=True, text=True)
  assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
  rows = [json.loads(line) for line in (out / "gpu_window.jsonl").read_text().splitlines()]
  by_kind = {k: [r for r in rows if r["kind"] == k] for k in KINDS}
  assert all(by_kind.values()), {k: len(v) for k, v in by_kind.items()}
  assert {r["kind"] for r in rows} <= set(KINDS)
  assert all(math.isfinite(x) for r in rows for x in _numbers(r))
  assert rows[0]["kind"] == "window" and rows[0]["commit"] == "test"
  assert rows[-1]["kind"] == "window_end"
  stages = {r["stage"]: r["status"] for r in by_kind["stage"]}
  # The order: the kernels checked, the C4 step right after parity, then the timings, the
  # counters and the profile.
  assert list(stages) == ["env", "rung_forward", "rung_dq", "rung_ds_two_warpgroups",
                          "mosaic_parity", "c4_b2", "time_T64", "counters", "profile"], stages
  # The Mosaic ladder runs in interpret mode where jax >= 0.11 has it, else refuses (exit 2).
  # Parity before any timing; on a CPU the Mosaic kernels refuse it in one line (they need a
  # Hopper GPU compiled).
  mosaic = ("rung_forward", "rung_dq", "rung_ds_two_warpgroups", "mosaic_parity")
  assert all(stages[n] in ("ok", "refused") for n in mosaic), stages
  assert all(s == "ok" for n, s in stages.items() if n not in (*mosaic, "counters")), stages
  assert stages["counters"] == "skipped", stages  # ncu waits for Mosaic's parity
  first_timing = min(i for i, r in enumerate(rows) if r["kind"] == "tune")
  assert max(i for i, r in enumerate(rows) if r["kind"] == "parity") < first_timing
  parity = by_kind["parity"]
  assert [(r["implementation"], r["seq_len"], r["status"]) for r in parity] == [
      ("mosaic", 64, "unsupported")], parity
  # The C4 step: softmax, and HYLA through blockwise where the Mosaic kernels have not passed
  # parity in this window (a skipped row says so).
  steps = by_kind["c4_step"]
  assert [r.get("label") for r in steps if "steps_per_s" in r] == [
      "softmax", "hyla@model.implementation=blockwise"]
  skipped = [r for r in steps if r.get("status") == "skipped"]
  assert [r["model"] for r in skipped] == ["hyla@model.implementation=mosaic"], skipped
  tune = {r["name"]: r for r in by_kind["tune"]}
  assert tune["softmax"]["status"] == "ok" and tune["softmax"]["fwd_bwd_ms"] > 0
  blockwise = [r for r in by_kind["tune"] if r["name"] == "blockwise"]
  assert [(r["block_q"], r["status"]) for r in blockwise] == [(32, "ok")], blockwise
  # Mosaic never passes parity on a CPU, so no stage times it beside others: a "skipped" row
  # with the reason, per stage that would have run it (the timing and the profile).
  mosaic = [r for r in by_kind["tune"] if r["name"] == "mosaic"]
  assert len(mosaic) == 2 and all(r["status"] == "skipped" and "parity" in r["message"]
                                  for r in mosaic), mosaic
  assert sorted(os.listdir(out)) == ["gpu_window.jsonl", "gpu_window.log"]


def test_a_failed_rung_ends_the_window_before_timing(tmp_path, monkeypatch):
  """The stage loop itself, with stand-in commands: the first rung of the Mosaic ladder
  fails (a fault, a memcheck error), nothing after it runs."""
  from launch import gpu_window  # pylint: disable=g-import-not-at-top
  real = gpu_window.stages

  def stand_ins(sizes):
    fake = {"env": "print('{\"device_kind\": \"x\"}')", "rung_forward": "raise SystemExit(1)"}
    return [gpu_window.Stage(s.name, 5, (lambda code: lambda w, limit: [
        sys.executable, "-c", code])(fake.get(s.name, "print('ran')")), s.parse,
                             min_s=1, stops_window=s.stops_window)
            for s in real(sizes)]

  monkeypatch.setattr(gpu_window, "stages", stand_ins)
  assert gpu_window.main([f"--out={tmp_path}", "--dry_run"]) == 1
  rows = [json.loads(line) for line in (tmp_path / "gpu_window.jsonl").read_text().splitlines()]
  assert [r.get("stage") for r in rows if r["kind"] == "stage"] == ["env", "rung_forward"]
  assert rows[1] == {"kind": "env", "device_kind": "x"}
  assert rows[-1]["kind"] == "window_end" and "nothing timed" in rows[-1]["message"]


def test_mosaic_is_timed_beside_others_only_after_passing_parity_in_this_window(tmp_path):
  """A kernel that faults kills its process's CUDA context (the H100 window of 2026-11-27),
  so the timing stages time Mosaic beside cuDNN and XLA only once its bf16 parity passed in
  the same window: no rows yet (`--stages=time_c4` alone) or float32's "unsupported" leave it
  out, as does an "error" or "fail" row (recorded, with the reason); another kernel's error
  does not matter."""
  from launch import gpu_window  # pylint: disable=g-import-not-at-top
  window = gpu_window.Window(str(tmp_path), gpu_window.GPU, math.inf)
  def argv(name="time_T4096"):
    stage = next(s for s in gpu_window.stages(gpu_window.GPU) if s.name == name)
    return stage.argv(window, 100)
  configs = lambda name="time_T4096": next(a for a in argv(name) if a.startswith("--configs="))

  for name in ("time_T4096", "time_c4", "profile"):
    assert "mosaic:" not in configs(name)
  window.record("parity", implementation="mosaic", seq_len=256, dtype="float32",
                status="unsupported")
  window.record("parity", implementation="blockwise", seq_len=256, dtype="bfloat16",
                status="error")
  assert "mosaic:" not in configs()
  window.record("parity", implementation="mosaic", seq_len=256, dtype="bfloat16",
                status="pass")
  assert configs() == "--configs=mosaic:64x8x8:kernel:paired,blockwise:256x256"
  # The dS kernel on two warpgroups, last, once its own rung passed here (from T=512).
  window.record("rung", rung="dq", schedule="ds_two_warpgroups", status="pass")
  variant = "mosaic:64x8x8:kernel:paired:ds_two_warpgroups"
  assert configs() == f"--configs=mosaic:64x8x8:kernel:paired,blockwise:256x256,{variant}"
  assert configs("time_T1024").endswith(variant) and variant not in configs("time_sraven")
  # Each shape in its own process, beside cuDNN (always its first row) and blockwise.
  assert argv("time_c4")[-5:] == ["--seq_len=512", "--batch=64", "--heads=8", "--head_dim=64",
                                    f"--configs=mosaic:64x8x8:kernel:paired,blockwise:256x256,"
                                    f"{variant}"]
  assert "--heads=16" in argv("time_sraven") and "--head_dim=2" in argv("time_fuzzy")
  assert argv("profile")[-2:] == ["--configs=mosaic:64x8x8:kernel:paired", "--profile"]
  window.record("parity", implementation="mosaic", seq_len=1000, dtype="bfloat16",
                status="error", message="does not compile")
  assert configs() == "--configs=blockwise:256x256"
  last = [json.loads(line) for line in (tmp_path / "gpu_window.jsonl").read_text().splitlines()]
  assert [r["config"] for r in last[-2:]] == ["mosaic:64x8x8:kernel:paired", variant]
  assert last[-2] == {"kind": "tune", "name": "mosaic", "config": "mosaic:64x8x8:kernel:paired",
                      "status": "skipped", "seq_len": 4096, "batch": 4,
                      "message": "mosaic's parity in this window: error at T=1000 bfloat16"}


def test_the_stage_budgets_fit_eight_minutes_with_the_install():
  """Every stage's budget (the last window's measured seconds + 30%) and the install fit in 8
  minutes once T=16384, the last and optional stage, is left out; the deadline is what remains;
  no stage needs more time left than its budget gives it."""
  from launch import gpu_window  # pylint: disable=g-import-not-at-top
  budgets = {s.name: s.budget_s for s in gpu_window.stages(gpu_window.GPU)}
  assert all(s.min_s <= s.budget_s for s in gpu_window.stages(gpu_window.GPU))  # else never run
  assert list(budgets)[-1] == "time_T16384"
  assert sum(budgets.values()) - budgets["time_T16384"] + 15 <= 480
  assert gpu_window.GPU.deadline_s + 15 <= 480


def test_a_window_in_which_no_stage_can_run_says_so_and_fails(tmp_path):
  """--deadline_s below every stage's minimum: each stage is skipped, never started, and the
  window ends with one line and exit 1 (it exited 0 having measured nothing)."""
  from launch import gpu_window  # pylint: disable=g-import-not-at-top
  assert gpu_window.main([f"--out={tmp_path}", "--dry_run", "--deadline_s=0.5"]) == 1
  rows = [json.loads(line) for line in (tmp_path / "gpu_window.jsonl").read_text().splitlines()]
  assert {r["status"] for r in rows if r["kind"] == "stage"} == {"skipped"}
  assert "no stage ran" in rows[-1]["message"]


def test_counters_run_ncu_on_the_passed_kernels_and_keep_one_row_per_kernel(tmp_path,
                                                                            monkeypatch):
  """The counters stage waits for Mosaic's bf16 parity and for ncu; it runs the kernels'
  fwd+bwd at B=4, T=4096 under ncu, and each kernel's line of ncu's raw CSV (a header, a
  units line, then one line per kernel; numbers may carry thousands separators) becomes one
  `ncu` row with its metrics as numbers."""
  from launch import gpu_window  # pylint: disable=g-import-not-at-top
  window = gpu_window.Window(str(tmp_path), gpu_window.GPU, math.inf)
  stage = next(s for s in gpu_window.stages(gpu_window.GPU) if s.name == "counters")
  monkeypatch.setattr(gpu_window, "_cuda_tool", lambda name: None)
  assert "parity" in stage.requires(window)
  window.record("parity", implementation="mosaic", seq_len=1000, dtype="bfloat16",
                status="pass")
  assert "no ncu" in stage.requires(window)
  monkeypatch.setattr(gpu_window, "_cuda_tool", lambda name: f"/opt/{name}")
  assert stage.requires(window) is None
  argv = stage.argv(window, 90)
  ncu = argv.index("/opt/ncu")
  assert argv[ncu + 1:ncu + 3] == ["--clock-control", "none"]  # the device's clocks as set
  assert argv[argv.index("--launch-count") + 1] == "5"  # forward, dS, dV, dQ, dK
  assert argv[-5:] == ["fwd_bwd", "--batch=4", "--seq_len=4096", "--heads=8", "--head_dim=64"]
  lines = ['==PROF== Connected to process 7',
           '{"rung": "fwd_bwd", "status": "pass", "seconds": 9.1}',
           '"ID","Process ID","Kernel Name","Grid Size","gpu__time_duration.sum",'
           '"sm__warps_active.avg.pct_of_peak_sustained_active"',
           '"","","","","nsecond","%"',
           '"0","7","hyla_forward_mosaic_gpu_kernel","(64, 16, 4)","6,960,512","12.4"',
           '"1","7","hyla_ds_mosaic_gpu_kernel","(64, 4, 1)","n/a","30"']
  for line in lines:
    stage.parse(window, line)
  rows = [json.loads(x) for x in (tmp_path / "gpu_window.jsonl").read_text().splitlines()]
  assert rows[1] == {"kind": "rung", "rung": "fwd_bwd", "status": "pass", "seconds": 9.1}
  ncu_rows = [r for r in rows if r["kind"] == "ncu"]
  assert [r["kernel"] for r in ncu_rows] == ["hyla_forward_mosaic_gpu_kernel",
                                             "hyla_ds_mosaic_gpu_kernel"]
  assert ncu_rows[0]["metrics"] == {"gpu__time_duration.sum": 6960512.0,
                                    "sm__warps_active.avg.pct_of_peak_sustained_active": 12.4}
  assert ncu_rows[1]["metrics"]["gpu__time_duration.sum"] == "n/a"

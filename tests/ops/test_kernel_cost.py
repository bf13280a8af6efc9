"""`ops/kernel_cost.py`, `auto`'s model of the fused kernels' and blockwise's time on Hopper,
held to the committed rows of the H200 window of 2026-11-28 (the rows it was not calibrated on),
and the choice `auto` makes from it."""

import json
import pathlib

import pytest

from hypernet_attention.ops import dispatch
from hypernet_attention.ops import kernel_cost

WINDOW = pathlib.Path(__file__).parents[2] / "experiments/results/gpu_windows/2026-11-28_h200"


def _tune_rows():
  rows = [json.loads(line) for line in (WINDOW / "gpu_window.jsonl").read_text().splitlines()]
  return [r for r in rows if r["kind"] == "tune" and r["status"] == "ok"]


def _measured(name, seq_len, **config):
  found = [r["fwd_bwd_ms"] for r in _tune_rows() if r["name"] == name and r["seq_len"] == seq_len
           and all(r.get(k) == v for k, v in config.items())]
  assert found, (name, seq_len, config)
  return min(found)


PAIRED = dict(block_q=64, block_k=8, block_v=8, paired=True)


def test_the_calibration_is_the_windows_own_row():
  row = next(r for r in _tune_rows() if r["seq_len"] == 4096 and r.get("paired") and
             r["block_v"] == 8 and r.get("kernels_ms"))
  kernels = {k.split("_")[1]: ms for k, ms in row["kernels_ms"].items() if k.startswith("hyla_")}
  c = kernel_cost.CALIBRATION
  assert c["kernels_ms"] == {"forward": kernels["forward"], "dS": kernels["ds"],
                             "dV": kernels["dv"]}
  assert c["blockwise_ms"] == pytest.approx(_measured("blockwise", 4096), abs=1e-3)
  assert kernel_cost.mosaic_ms(4, 4096, 4096, 8, 64, True, as_measured=True) == pytest.approx(
      sum(c["kernels_ms"].values()) + c["other_ms"])


@pytest.mark.parametrize("seq_len", [1024, 16384])
def test_the_model_predicts_the_rows_it_was_not_fitted_on(seq_len):
  """B=4, H=8, D=V=64, causal: within 10% of the measured fwd+bwd, for both implementations. A
  model by pairs alone (the T=4096 row's ms per pair) would put the kernels at 1.4 ms at T=1024,
  half of the measured 2.64: the dS kernel's 64 CTAs fill half of the 132 multiprocessors."""
  mosaic = kernel_cost.mosaic_ms(4, seq_len, seq_len, 8, 64, True, as_measured=True)
  blockwise = kernel_cost.blockwise_ms(4, seq_len, seq_len, 8, 64, True)
  assert mosaic == pytest.approx(_measured("mosaic", seq_len, **PAIRED), rel=0.1)
  assert blockwise == pytest.approx(_measured("blockwise", seq_len), rel=0.1)
  by_pairs = _measured("mosaic", 4096, **PAIRED) * (seq_len / 4096) ** 2
  if seq_len == 1024:
    assert by_pairs < 0.6 * _measured("mosaic", seq_len, **PAIRED)


def test_auto_takes_the_kernels_wherever_a_row_shows_them_faster():
  """Every committed length where the paired kernels beat blockwise (all three, B=4) is chosen."""
  for seq_len in (1024, 4096, 16384):
    assert _measured("mosaic", seq_len, **PAIRED) < _measured("blockwise", seq_len)
    assert dispatch.choose_implementation(seq_len, seq_len, "rms_head", "mlp", backend="gpu",
                                          fused=True, batch=4, heads=8, v_dim=64,
                                          causal=True) == "mosaic"


def test_the_schedule_today_is_modeled_shorter_and_its_split_is_the_kernels():
  """The reversed query tiles and split dS keys (not yet timed): what the next window should see
  at B=4 against the rows (T=4096 22.5 ms, T=1024 2.64); the split is the kernel's own."""
  from hypernet_attention.ops import mosaic_kernel_bwd  # pylint: disable=g-import-not-at-top
  assert kernel_cost.DS_SPLIT_KEYS == mosaic_kernel_bwd.DS_SPLIT_KEYS
  for seq_len, at_most in ((4096, 19.0), (1024, 1.8)):
    today = kernel_cost.mosaic_ms(4, seq_len, seq_len, 8, 64, True)
    assert today < at_most < kernel_cost.mosaic_ms(4, seq_len, seq_len, 8, 64, True,
                                                    as_measured=True)


def test_auto_chooses_by_fill_not_length():
  """At one length the choice turns on the batch: C4's B=64 at T=512 (512 dS CTAs) takes the
  kernels; B=1 at T=1024 or 4096 (16-64 dS CTAs, the longest a whole key loop) keeps blockwise;
  below MIN_KEYS (SRAVEN's 36, fuzzy logic's 33) no row covers the kernels."""
  choose = lambda batch, t, heads=8, v_dim=64: dispatch.choose_implementation(
      t, t, "rms_head", "mlp", backend="gpu", fused=True, batch=batch, heads=heads, v_dim=v_dim,
      causal=True)
  assert choose(64, 512) == "mosaic"
  assert choose(1, 1024) == choose(1, 4096) == "blockwise"
  assert choose(128, 36, heads=16, v_dim=4) == choose(128, 33, v_dim=2) == "blockwise"
  assert dispatch.choose_implementation(4096, 4096, "rms_head", "mlp", backend="gpu",
                                        batch=4, causal=True) == "blockwise"  # not fused here

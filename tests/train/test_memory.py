"""A batch that cannot fit is refused in one line before any work (`train/memory.py`).

The check reads XLA's memory analysis of the compiled first chunk. These tests shrink the
memory the check sees (the machine's own is far larger than a smoke run needs), so they
hold on any host; one runs the entry point with a batch no host has memory for.
"""

import logging
import os
import re
import sys
import types

import pytest

from hypernet_attention import errors
from hypernet_attention.runs import config_checks
from hypernet_attention.train import build
from hypernet_attention.train import loop
from hypernet_attention.train import memory
from hypernet_attention.train import trainer as trainer_lib

import train_testlib as tl

MiB = 2**20


def _footprint(config) -> memory.Footprint:
  s = build.setup(config_checks.validate(config))
  trainer = trainer_lib.Trainer(config, s)
  return memory.footprint(trainer.compile_chunk(s.restore_target(), config.steps_per_loop))


def _host_memory(monkeypatch, num_bytes):
  monkeypatch.setattr(memory, "host_available_bytes", lambda: num_bytes)


def test_the_suggested_batch_fits_and_the_refused_one_does_not(monkeypatch):
  """The one line names the batch and a batch that fits; compiled at that batch, the chunk
  does fit (temporaries grow about in proportion to the batch), and at the refused one not."""
  big = _footprint(tl.smoke("fuzzy_logic", batch_size=256))
  available = big.total // 3
  _host_memory(monkeypatch, available)
  with pytest.raises(errors.BadInput) as refused:
    loop.train_and_evaluate(tl.smoke("fuzzy_logic", batch_size=256), "/nonexistent/wd")
  message = str(refused.value)
  assert message.startswith("batch_size=256 does not fit in memory"), message
  assert "\n" not in message
  suggested = int(re.search(r"a batch_size of about (\d+) or less would fit", message)[1])
  assert 256 // 4 <= suggested < 256 // 2  # A third of the memory: about a third of the batch.
  assert _footprint(tl.smoke("fuzzy_logic", batch_size=suggested)).total <= available
  assert not os.path.exists("/nonexistent")


def test_a_refused_resume_leaves_the_run_as_it_was(monkeypatch, tmp_path, caplog):
  workdir = str(tmp_path / "wd")
  loop.train_and_evaluate(tl.smoke("sraven", stop_after_steps=4,
                                   **{"eval.ceiling_problems": 0}), workdir)
  before = tl.snapshot(workdir)
  _host_memory(monkeypatch, MiB)
  with pytest.raises(errors.BadInput, match=r"^batch_size=16 does not fit in memory"):
    loop.train_and_evaluate(tl.smoke("sraven", **{"eval.ceiling_problems": 0}), workdir)
  assert tl.snapshot(workdir) == before  # No lock, config, event or checkpoint touched.
  monkeypatch.undo()
  caplog.set_level(logging.INFO)
  summary = loop.train_and_evaluate(tl.smoke("sraven", **{"eval.ceiling_problems": 0}),
                                    workdir)
  assert summary["step"] == 8  # The same run resumes where it stopped.
  assert re.search(r"First chunk \(4 steps\) compiled in [\d.]+s; it needs [\d.]+ MiB per "
                   r"device; this host has [\d.]+ GiB available", caplog.text), caplog.text


def test_a_population_is_refused_naming_its_members(monkeypatch, tmp_path):
  config = tl.smoke("fuzzy_logic")
  config.population.members = ({"seed": 0}, {"seed": 1}, {"seed": 2})
  _host_memory(monkeypatch, MiB)
  with pytest.raises(errors.BadInput, match=r"^batch_size=16 with 3 members does not fit.*"
                     r"or fewer members"):
    loop.train_and_evaluate(config, str(tmp_path / "pop"))
  assert not (tmp_path / "pop").exists()


def test_a_workdir_problem_is_named_before_the_compilation(monkeypatch, tmp_path):
  """The dry workdir guard runs before the memory check's compilation."""
  (tmp_path / "file").write_text("x")
  monkeypatch.setattr(trainer_lib.Trainer, "compile_chunk",
                      lambda *a: pytest.fail("compiled before the workdir was checked"))
  with pytest.raises(errors.BadInput, match="is a file, not a directory"):
    loop.train_and_evaluate(tl.smoke("sraven"), str(tmp_path / "file"))


def _device(platform, kind="cpu", bytes_limit=None):
  stats = None if bytes_limit is None else {"bytes_limit": bytes_limit, "bytes_in_use": 0}
  return types.SimpleNamespace(platform=platform, device_kind=kind, process_index=0,
                               memory_stats=lambda: stats)


def _compiled(arguments, outputs, alias, temporaries):
  stats = types.SimpleNamespace(argument_size_in_bytes=arguments, output_size_in_bytes=outputs,
                                alias_size_in_bytes=alias, temp_size_in_bytes=temporaries)
  return types.SimpleNamespace(memory_analysis=lambda: stats)


def test_accelerator_limit_and_shared_host_memory(monkeypatch):
  """An accelerator's own limit counts per device; CPU devices share the host's memory."""
  gpu = [_device("gpu", "NVIDIA H100 80GB HBM3", bytes_limit=1000 * MiB)] * 4
  fits = _compiled(400 * MiB, 400 * MiB, 400 * MiB, 500 * MiB)  # Donated: 900 MiB.
  assert memory.check_fits(fits, gpu, batch_size=64).need.total == 900 * MiB
  with pytest.raises(errors.BadInput, match=r"one NVIDIA H100 80GB HBM3 gives XLA 0.98 GiB;"
                     r" allowed: a batch_size of about 96 or less would fit"):
    memory.check_fits(_compiled(400 * MiB, 0, 0, 800 * MiB), gpu, batch_size=128)
  with pytest.raises(errors.BadInput, match=r"the state alone needs 1.17 GiB per device"):
    memory.check_fits(_compiled(1200 * MiB, 0, 0, 1), gpu, batch_size=128)
  _host_memory(monkeypatch, 2000 * MiB)
  cpus = [_device("cpu")] * 4
  with pytest.raises(errors.BadInput, match=r"shared by its 4 CPU devices"):
    memory.check_fits(fits, cpus, batch_size=64)  # 4 x 900 MiB > 2000 MiB.
  assert memory.check_fits(fits, cpus[:2], batch_size=64).have.shared_by == 2
  _host_memory(monkeypatch, None)  # Unknown: never refused.
  assert memory.check_fits(fits, cpus, batch_size=64).have is None


def test_entry_point_refuses_a_batch_no_host_has_in_one_line(tmp_path):
  out = tl.run(
      [sys.executable, os.path.join("experiments", "fuzzy_logic.py"),
       "--config=experiments/configs/fuzzy_logic.py:model=hyla,size=smoke",
       f"--config.batch_size={2**24}", f"--workdir={tmp_path / 'wd'}"],
      env=tl.subprocess_env(), cwd=tl.REPO, capture_output=True, text=True)
  assert out.returncode == 2, out.stderr[-3000:]
  lines = out.stderr.strip().splitlines()
  assert re.fullmatch(r"fuzzy_logic\.py: error: batch_size=16777216 does not fit in memory: "
                      r".* GiB per device .*; allowed: a batch_size of about \d+ or less "
                      r"would fit; or more devices", lines[-1]), lines[-1]
  assert not any("Traceback" in line for line in lines)
  assert not (tmp_path / "wd").exists()


def test_no_advice_that_cannot_be_followed(monkeypatch):
  """issue 46: a state that fits but whose temporaries for even one example do not gave
  'a batch_size of about 0 or less'; the advice is now a smaller model or more devices."""
  gpu = [_device("gpu", "NVIDIA H100 80GB HBM3", bytes_limit=1000 * MiB)]
  with pytest.raises(errors.BadInput) as refused:
    memory.check_fits(_compiled(900 * MiB, 0, 0, 64 * 200 * MiB), gpu, batch_size=64,
                      members=4)
  message = str(refused.value)
  assert "or less" not in message and "\n" not in message
  assert message.endswith("allowed: even batch_size=1 would not fit (about 0.20 GiB of "
                          "temporaries per example beside 0.88 GiB of state): a smaller "
                          "model (model.emb_dim, model.mlp_dim, model.num_layers), fewer "
                          "members or more devices"), message

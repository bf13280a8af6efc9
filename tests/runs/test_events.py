"""Event files written without TensorFlow read back as TensorBoard reads them.

Scalars round-trip through `curves.read_scalars` (tensorboard's own reader) at float32
precision, across flushes and across a resumed run's second file, the last write of a step
winning; hyperparameters land as the hparams plugin's session record; a resumed run
(`step` > 0) writes no run-start records; processes other than 0 write no file; a bucket
file is rewritten whole, at most every `remote_flush_s` unless forced.
"""

import os

import ml_collections
import numpy as np
from tensorboard.backend.event_processing import event_file_loader
from tensorboard.plugins.hparams import plugin_data_pb2

from hypernet_attention.runs import curves
from hypernet_attention.runs import events


def _records(path):
  return list(event_file_loader.EventFileLoader(str(path)).Load())


def test_scalars_round_trip_across_flushes_and_a_resumed_file(tmp_path):
  writer = events.EventsWriter(str(tmp_path))
  writer.write_scalars(1, {"train/loss": 2.5, "train/accuracy": np.float32(0.25)})
  size = os.path.getsize(writer.path)  # Written at once: locally each flush appends.
  writer.write_scalars(2, {"train/loss": 1 / 3})
  assert os.path.getsize(writer.path) > size
  writer.close()
  resumed = events.EventsWriter(str(tmp_path))  # A resumed run: a second file, same folder.
  resumed.write_scalars(2, {"train/loss": 0.75})  # Step 2 again: the last write wins.
  resumed.write_scalars(3, {"train/loss": 0.5})
  resumed.close()
  assert writer.path != resumed.path
  got = curves.read_scalars(str(tmp_path), ["train/loss", "train/accuracy"])
  np.testing.assert_array_equal(got["train/loss"][0], [1, 2, 3])
  np.testing.assert_allclose(got["train/loss"][1], [2.5, 0.75, 0.5], rtol=1e-7)
  np.testing.assert_array_equal(got["train/accuracy"][0], [1])
  np.testing.assert_allclose(got["train/accuracy"][1], [0.25])
  assert _records(writer.path)[0].file_version == "brain.Event:2"


def test_run_start_writes_the_config_and_constants_once(tmp_path):
  config = ml_collections.ConfigDict({"seed": 3, "model": {"attention": "hyla", "emb_dim": 32},
                                      "optimizer": {"learning_rate": 1e-3}})
  (tmp_path / "new").mkdir()
  (tmp_path / "resumed").mkdir()
  writer = events.EventsWriter(str(tmp_path / "new"))
  events.write_run_start(writer, 0, config, {"test/accuracy_ceiling": 0.9})
  writer.close()
  [session] = [plugin_data_pb2.HParamsPluginData.FromString(
      v.metadata.plugin_data.content).session_start_info
               for e in _records(writer.path) for v in e.summary.value
               if v.metadata.plugin_data.plugin_name == "hparams"]
  hparams = {k: v.WhichOneof("kind") and getattr(v, v.WhichOneof("kind"))
             for k, v in session.hparams.items()}
  assert hparams["seed"] == 3 and hparams["model.attention"] == "hyla"
  assert hparams["model.emb_dim"] == 32 and hparams["optimizer.learning_rate"] == 1e-3
  got = curves.read_scalars(str(tmp_path / "new"), ["test/accuracy_ceiling"])
  np.testing.assert_allclose(got["test/accuracy_ceiling"][1], [0.9], rtol=1e-7)

  resumed = events.EventsWriter(str(tmp_path / "resumed"))
  events.write_run_start(resumed, 500, config, {"test/accuracy_ceiling": 0.9})
  resumed.close()
  assert len(_records(resumed.path)) == 1  # The file header only.


def test_other_processes_write_no_file(tmp_path):
  writer = events.EventsWriter(str(tmp_path), just_logging=True)
  writer.write_scalars(1, {"train/loss": 1.0})
  writer.close()
  assert not list(tmp_path.iterdir())


def test_a_bucket_file_is_rewritten_whole_and_throttled(tmp_path, monkeypatch):
  written = []
  monkeypatch.setattr(events.run_files, "is_remote", lambda path: True)
  monkeypatch.setattr(events.run_files, "check_credentials", lambda *args, **kwargs: None)
  monkeypatch.setattr(events.run_files, "write_bytes",
                      lambda path, data: written.append(bytes(data)))
  writer = events.EventsWriter(str(tmp_path), remote_flush_s=3600)
  writer.write_scalars(1, {"train/loss": 1.0})  # First flush: written.
  writer.write_scalars(2, {"train/loss": 0.5})  # Within the hour: held back.
  assert len(written) == 1
  writer.close()  # Forced: everything so far, as one object.
  assert len(written) == 2 and written[1].startswith(written[0])
  assert len(written[1]) > len(written[0])
  writer.close()  # Nothing new: nothing written.
  assert len(written) == 2
  (tmp_path / "copy.v2").write_bytes(written[1])
  loss = [(e.step, v.tensor.float_val or v.simple_value) for e in _records(tmp_path / "copy.v2")
          for v in e.summary.value]
  assert [step for step, _ in loss] == [1, 2]

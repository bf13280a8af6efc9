"""Subprocess side of the two-process tests of tests/e2e/test_c4_train.py (seqio) and
tests/e2e/test_c4_grain.py (Grain; runs without TensorFlow).

  python tests/e2e/c4_process_helper.py PORT PROCESS_ID CORPUS_DIR WORKDIR OUT_DIR [PIPELINE]
      One of 2 processes (2 fake CPU devices each, gloo collectives) training the smoke
      `text_lm` config into the shared WORKDIR; writes the training batches it read to
      OUT_DIR/batches_<PROCESS_ID>.npy and process 0 the summary to OUT_DIR/summary.json.
      PIPELINE: config.task.pipeline, seqio (default) or grain.
SIGUSR1 prints every thread's stack to the log (`train_testlib.reap` sends it to a process
still running when its peer has failed).
"""

import faulthandler
import json
import os
import signal
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))

# pylint: disable=g-import-not-at-top,wrong-import-position
import jax
import numpy as np

# jax's own options, before anything initializes a backend.
jax.config.update("jax_platforms", "cpu")
jax.config.update("jax_num_cpu_devices", 2)

from experiments.configs import c4_lm
from hypernet_attention.train import data
from hypernet_attention.train import loop
from hypernet_attention.train import runtime
from hypernet_attention.train import trainer

# pylint: enable=g-import-not-at-top,wrong-import-position


def main(port, process_id, corpus_dir, workdir, out_dir, pipeline="seqio"):
  faulthandler.register(signal.SIGUSR1, all_threads=True)
  runtime.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2,
                     process_id=int(process_id), cpu_collectives="gloo")
  config = c4_lm.get_config("model=hyla,size=smoke")
  config.task.update(train_files=os.path.join(corpus_dir, "train.jsonl"),
                     validation_files=os.path.join(corpus_dir, "validation.jsonl"),
                     vocabulary=os.path.join(corpus_dir, "vocabulary.model"),
                     pipeline=pipeline)
  seen = []

  def record_grain(self):  # Trainer._next_batch, keeping this process's rows.
    local = next(self.data_iterator)
    seen.append(local["targets"])
    return data.to_global(local, self.mesh, self.config.batch_size)

  if pipeline == "grain":
    trainer.Trainer._next_batch = record_grain
  else:
    from hypernet_attention.tasks import c4  # The seqio path only: it needs TensorFlow.
    original = c4.DataIterator.__next__

    def record(self):
      batch = original(self)
      seen.append(batch["targets"])
      return batch

    c4.DataIterator.__next__ = record
  summary = loop.train_and_evaluate(config, workdir)
  np.save(os.path.join(out_dir, f"batches_{process_id}.npy"), np.stack(seen))
  if int(process_id) == 0:
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
      json.dump({k: v for k, v in summary.items() if k != "state"}, f)


if __name__ == "__main__":
  main(*sys.argv[1:])

"""Fig. 6: C4 language modeling at 50M parameters, softmax vs linear attention vs HYLA.

12 jobs: 3 models x the paper's lr {1e-3, 3e-3} x wd {0.1, 0.03} (the paper's appendix), one seed,
at `size=50m` (992,000 steps of 256 x 512 tokens = 130B tokens each; the paper: 72-100 h
on 16 TPU v5e per run). Every job needs the TFDS c4/en data: add
`--config.task.data_dir=gs://BUCKET/tensorflow_datasets` (see experiments/configs/c4_lm.py).
Reported metric: `validation/loss` (and perplexity, bits per byte) in each summary.json;
pick the best lr/wd per model, as the paper does."""

from launch.sweeps import common

EXPERIMENT = "c4_lm"


def get_sweep():
  return [{"config": f"model={p['model']},size=50m", "optimizer.learning_rate": p["lr"],
           "optimizer.weight_decay": p["wd"]}
          for p in common.product(model=list(common.MAIN_MODELS), lr=[1e-3, 3e-3], wd=[0.1, 0.03])]

r"""SRAVEN (symbolic Raven's progressive matrices): softmax vs linear attention vs HYLA.

Arguments (`--config=experiments/configs/sraven.py:model=hyla,size=paper,width=1,depth=4`):
  model  any preset of `hypernet_attention.presets.PRESETS` (softmax, linear, hyla, ...).
  size   paper  the paper (SRAVEN, appendix): K=4 features, F=8 values, 25% of the 330 rule
                combinations held out; 4 layers, D=128, 16 heads, qk/v width 64, MLP 256 (402,824
                params at width 1, depth 4); batch 128, 156,250 steps (20M problems), AdamW lr 1e-3,
                wd 0.1, warmup 1000, cosine to 0.1x; 51,200 eval problems. Hardware: one GPU/TPU.
                Expected (Table A1, OOD accuracy): softmax ~57%, linear ~56%, HYLA ~69%.
         demo   the first run (the entry point's default): `local` with 2 features instead
                of 3, 24,000 steps; ~10 min on a 2-core CPU, where HYLA answers held-out
                rule combinations far above chance. See `DEMO` below.
         local  5-11 min on a 2-core CPU: see `LOCAL` below for what it changes and
                what it reaches.
         smoke  a few seconds, for tests.
  width  multiplies D, heads, qk/v width and MLP width (the paper's scaling grid: 1, 2, 4).
  depth  number of layers (the paper: 4, 8, 16).

Seeds: `seed` sets initialization, data order and dropout; `task.split_seed` the held-out
combinations (`config_common.follow_run_seed`: by default the run's seed, as in the paper).

Command (paper size, one run of the scaling grid):
  python experiments/sraven_scaling.py \
    --config=experiments/configs/sraven.py:model=hyla,size=paper,width=1,depth=4 \
    --workdir=workdirs/sraven_hyla_w1_d4"""

import ml_collections

from hypernet_attention.runs import config_common

SIZES = ("paper", "demo", "local", "smoke")

# size=local: the paper's task with 3 features instead of 4 (C(10,3)=120 rule combinations, 30 held
# out; 27 tokens) and a smaller model (2 layers, D=64, 8 heads, qk/v width 32, MLP 128; 52,024
# params), batch 64, 12,000 steps (768k problems), 4,096 eval problems. Chosen by measurement on a
# 2-core CPU (paper size runs at only a few steps/s there). Its results (`python -m launch.run_local
# --sweep=table_a1_sraven_local`, experiments/results/cpu_table_a1.md): every model is at the start
# of its learning curve; compare HYLA with softmax at paper size on an accelerator.
LOCAL = dict(
    task=dict(num_features=3, num_values=8),
    model=dict(num_layers=2, emb_dim=64, num_heads=8, qk_dim=32, v_dim=32, mlp_dim=128),
    batch_size=64, num_train_steps=12_000, steps_per_loop=50, log_every_steps=200,
    eval_every_steps=2000, checkpoint_every_steps=2000,
    optimizer=dict(learning_rate=1e-3, warmup_steps=500),
    eval=dict(num_problems=4096, batch_size=512, ceiling_problems=2048))

# size=demo: `local` with 2 features (C(9,2)=36 rule combinations, 9 held out; chance 1/64
# for an answer panel) and twice the steps; every run far above chance
# (experiments/results/sraven_local_2features_24k.md).
DEMO = dict(task=dict(num_features=2), num_train_steps=24_000)


def get_config(arg=None) -> ml_collections.ConfigDict:
  arg = config_common.parse_arg(arg, {"size": SIZES}, model="hyla", size="local", width=1, depth=4)
  if arg.width < 1 or arg.depth < 1:
    raise ValueError(f"width={arg.width} and depth={arg.depth} must be positive integers")
  c = config_common.base_config(experiment="sraven")
  c.task = ml_collections.ConfigDict(dict(
      num_features=4, num_values=8, grid_size=3, holdout_fraction=0.25,
      permute_features=True, split_seed=config_common.follow_run_seed()))
  w = arg.width
  c.model = config_common.model_config(
      arg.model, num_layers=arg.depth, emb_dim=128 * w, num_heads=16 * w, qk_dim=64 * w,
      v_dim=64 * w, mlp_dim=256 * w)
  c.update(batch_size=128, num_train_steps=156_250, steps_per_loop=250, log_every_steps=1000,
           eval_every_steps=15_625, checkpoint_every_steps=15_625)
  c.optimizer.update(learning_rate=1e-3, weight_decay=0.1, warmup_steps=1000)
  c.eval.update(splits=("test", "ood"), num_problems=51_200, batch_size=1024, ceiling_problems=4096)

  if arg.size in ("local", "demo"):
    c.update(LOCAL)
    if arg.size == "demo":
      c.update(DEMO)
  elif arg.size == "smoke":
    c.model.update(num_layers=2, emb_dim=32, num_heads=4, qk_dim=16, v_dim=16, mlp_dim=64)
    config_common.use_smoke_schedule(c)
    c.eval.update(ceiling_problems=32)
  return c.lock()

"""Fig. 5C: SRAVEN OOD accuracy vs number of heads H at equal parameters.

The paper names the experiment (Fig. 5C, "single head") but not its task or grid: SRAVEN and
the SRAVEN grid are our assumption.

3 models x H {1, 2, 4, 8, 16} x lr {3e-4, 1e-3} x wd {0.1, 0.3} x warmup {1000, 3000} x
3 seeds = 360 jobs at `size=paper`, width 1, depth 4. The total qk/v width stays 64 (the
config's `qk_dim`/`v_dim` are totals over heads), so each head has 64/H dimensions and every
H has the same parameter count except the T5 bias table (H x 36 per layer). At H=1 the
latent code is a scalar; the paper reports a clear OOD drop there (no numbers published)."""

from launch.sweeps import common

EXPERIMENT = "sraven"
HEADS = (1, 2, 4, 8, 16)


def get_sweep():
  configs = [{"config": f"model={p['model']},size=paper,width=1,depth=4",
              "model.num_heads": p["heads"]}
             for p in common.product(model=list(common.MAIN_MODELS), heads=list(HEADS))]
  return common.grid_points(configs, EXPERIMENT)

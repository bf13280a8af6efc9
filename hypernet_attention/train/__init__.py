"""Training proper: config -> sharded train state -> scanned jit steps -> Orbax.

The JAX-free run layer (run files, the workdir guard and lock, config checks, events,
curves, console, cli, the experiment registry) is `hypernet_attention.runs`; this package
builds on it. Modules (each reads in one sitting):
  objectives     per-experiment task, loss and metrics (SRAVEN, fuzzy logic, C4); `build`
                 calls the builder that `config.experiment`'s record names.
  data           where batches come from: on device (synthetic) or host (language model).
  state          TrainState, AdamW with warmup + cosine to 0.1x, weight-decay mask.
  sharding       mesh, logical axis rules -> NamedSharding, host-local -> global arrays.
  build          a validated Setup from a config (model, optimizer, mesh, abstract state);
                 no CLU, no TensorFlow: training, restore and the benchmarks start here.
  checkpointing  Orbax CheckpointManager: async atomic saves, resume, params-only restore.
  trainer        the jitted train chunk and evaluation of one run (Trainer).
  metrics        the loop's metrics (clu.metrics collections).
  memory         does the first chunk fit? XLA's memory analysis, before any work.
  loop           `train_and_evaluate(config, workdir)`: one loop (`run`) over a Program,
                 a single run (`SingleRun`) or a population (`population_loop`); process 0
                 records the config and holds the lock, the others are told.
  restore        read-only `restore_params(workdir, step, member)` for analysis (probing).
  preemption     SIGTERM -> finish the running chunk -> checkpoint -> exit 75; ChunkBound.
  runtime        entry-point start-up (`jax.distributed`), the one training `main`
                 (`experiment_main`: the record's trainer).
  benchmark, profiling, lm   throughput, per-op profiles, the language-model entry point.
  export_params  a run's final parameters kept apart from its checkpoints.
  population     members differing in seed / split seed / lr / wd / warmup as one vmapped
                 program (`config.population.members`); population_loop: its Program.
"""

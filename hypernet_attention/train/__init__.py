"""Training system: config -> sharded train state -> scanned jit steps -> events -> Orbax.

Modules (each reads in one sitting):
  registry       one Experiment record per experiment: config file, objective, data kind,
                 population, memory, probe, campaign template, entry point (no JAX).
  config_lib     `parse_arg` for `get_config(arg)`; config -> TransformerConfig.
  checks         every check a config needs before any work (messages users see).
  objectives     per-experiment task, loss and metrics (SRAVEN, fuzzy logic, C4); `build`
                 calls the builder that `config.experiment`'s record names.
  data           where batches come from: on device (synthetic) or host (language model).
  state          TrainState, AdamW with warmup + cosine to 0.1x, weight-decay mask.
  sharding       mesh, logical axis rules -> NamedSharding, host-local -> global arrays.
  build          a validated Setup from a config (model, optimizer, mesh, abstract state);
                 no CLU, no TensorFlow: training, restore and the benchmarks start here.
  run_files      every file a run keeps, local or gs:// (etils.epath), without JAX: names,
                 atomic JSON, finished?, population? (what launch/ uses).
  workdir        the workdir guard (config.json must match to resume), cached JSON.
  checkpointing  Orbax CheckpointManager: async atomic saves, resume, params-only restore.
  events         TensorBoard event files without TensorFlow.
  trainer        the jitted train chunk and evaluation of one run (Trainer).
  memory         does the first chunk fit? XLA's memory analysis, before any work.
  loop           `train_and_evaluate(config, workdir)`: one loop (`run`) over a Program,
                 a single run (`SingleRun`) or a population (`population_loop`).
  restore        read-only `restore_params(workdir, step, member)` for analysis (probing).
  preemption     SIGTERM -> finish the running chunk -> checkpoint -> exit 75; ChunkBound.
  runtime, cli   entry-point start-up (`jax.distributed`), the one training `main`
                 (`experiment_main`: the record's trainer), one-line errors.
  console        what the console shows; TensorFlow loaded quietly for the C4 data only.
  curves         learning curves from the event files.
  benchmark, profiling, lm   throughput, per-op profiles, the language-model entry point.
  population     members differing in seed / split seed / lr / wd / warmup as one vmapped
                 program (`config.population.members`); population_loop: its Program.
"""

"""Training system: configs -> sharded train state -> scanned jit steps -> CLU logs -> Orbax.

Modules (each reads in one sitting):
  registry       experiment name -> entry point, config file, metric (launchers, tests).
  config_lib     `parse_arg` for `get_config(arg)`; config -> TransformerConfig.
  objectives     per-experiment task, loss and metrics (SRAVEN, fuzzy logic), by name.
  state          TrainState, AdamW with warmup + cosine to 0.1x, weight-decay mask.
  sharding       mesh, logical axis rules -> NamedSharding, host-local -> global arrays.
  checkpointing  Orbax CheckpointManager: async atomic saves, resume, foreign-workdir guard.
  runtime        `jax.distributed` start-up and topology logging for the entry points.
  loop           `train_and_evaluate(config, workdir)`: the program the experiments run.
  population     members differing in seed / split seed / lr / wd / warmup as one vmapped
                 program (`config.population.members`); population_loop: its outputs.
"""

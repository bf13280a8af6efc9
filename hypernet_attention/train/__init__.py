"""Training proper: config -> sharded train state -> scanned jit steps -> Orbax.

It builds on the JAX-free run layer (`hypernet_attention.runs`). The entry is
`loop.train_and_evaluate(config, workdir)` (`runtime.experiment_main` for the scripts);
`restore.restore_params` reads a run back for analysis. Each module's docstring says what it holds.
"""

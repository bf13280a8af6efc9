"""The project's one input-error type, importable from tasks, models and the training code
alike (no dependencies, so no import cycles)."""


class BadInput(ValueError):
  """A config value, flag, shape, file or workdir that cannot work, found before any work.

  Entry points print its message as one line and exit with status 2 (`runs/cli.py`).
  """

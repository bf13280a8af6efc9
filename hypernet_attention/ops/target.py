"""The backend attention is traced for: jax's default, or the one `compiling_for` names.

Why: the ops choose by backend (blockwise's tile sizes, `auto`'s path, cuDNN for softmax,
XLA:CPU's bias-gradient matmul), and a program compiled for a device this process does not
have (an H100 from a CPU-only machine, `gpu_program.py`) must take the choices that device
would, not the CPU's.
"""

from __future__ import annotations

from collections.abc import Iterator
import contextlib
import contextvars

import jax

from hypernet_attention.errors import BadInput

BACKENDS = ("cpu", "gpu", "tpu")
_TARGET: contextvars.ContextVar[str | None] = contextvars.ContextVar("target", default=None)


def backend() -> str:
  """`compiling_for`'s backend inside it, else `jax.default_backend()`."""
  return _TARGET.get() or jax.default_backend()


@contextlib.contextmanager
def compiling_for(name: str) -> Iterator[None]:
  """Traces inside take the choices of backend `name` (one of BACKENDS)."""
  if name not in BACKENDS:
    raise BadInput(f"compiling_for({name!r}); allowed: {', '.join(BACKENDS)}")
  token = _TARGET.set(name)
  try:
    yield
  finally:
    _TARGET.reset(token)

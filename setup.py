"""hypernet-attention: Attention as a Hypernetwork (Schug et al., ICLR 2025) in JAX/Flax.

The versions tested together, and why each pin: experiments/reference.md, "Versions" (the
[grain] extra: grain 0.2.18 with array_record 0.8.6, tensorflow-datasets 4.9.10)."""

import setuptools

BASE = [
    # jax 0.12 (the current release) and 0.11 need Python >= 3.12; 0.10.2 runs on 3.11.
    "jax>=0.10.2,<0.13",
    "flax>=0.12.8,<0.13",
    "optax>=0.2.8,<0.3",
    # Shape contracts in the model and tasks, tree assertions and trace counts in tests.
    "chex>=0.1.92,<0.2",
    "orbax-checkpoint>=0.12.8,<0.13",
    "etils[epath]>=1.7",  # workdir I/O: local paths and gs:// alike
    "fsspec>=2026.9",  # epath's gs:// backend without TensorFlow (runs/run_files.py)
    "ml-collections>=1.1,<2",
    "clu==0.0.12",
    # TensorBoard event files are written without TensorFlow (it is only in [lm]).
    "tensorboard>=2.21,<2.22",
    "matplotlib>=3.9",
    "numpy>=2.0",
    # Latent-code probing: decoders, cross-validation, t-SNE, statistics, BLAS thread limits.
    "scikit-learn>=1.6,<2",
    "scipy>=1.13,<2",
    "threadpoolctl>=3.5,<4",
    "tqdm>=4.66,<5",  # the probe's progress bar
]

# The C4 language-modeling data pipeline (the only part that needs TensorFlow).
LM = [
    "tensorflow>=2.21,<2.22",
    "tensorflow-text>=2.21,<2.22",
    "tensorflow-datasets>=4.9.10,<5",
    "seqio==0.0.20",
    # 0.2.3's generated proto needs protobuf >= 7, which [launch] (xmanager) rules out:
    # with both extras it installs but fails at import. 0.2.2's works with protobuf 6 and 7.
    "sentencepiece>=0.2,<0.2.3"]

# The C4 language-modeling data path without TensorFlow (`config.task.pipeline='grain'`):
# Grain reads tfds.data_source's ArrayRecord files (tensorflow-datasets imports TensorFlow
# only when a tf.data pipeline asks for it). grain 0.2.18 has cp311-cp313 wheels. Measured
# (Python 3.11): grain + array_record + cloudpickle + portpicker 15.7 MB installed, all of
# [grain] ~233 MB (pyarrow, which tensorflow-datasets requires, is 174 MB of it); `import
# grain` after jax and orbax (which every run loads) ~0.27 s.
GRAIN = ["grain==0.2.18", "tensorflow-datasets>=4.9.10,<5", "sentencepiece>=0.2,<0.2.3"]

# gs:// workdirs: epath reaches buckets through gcsfs (Orbax through tensorstore, built in).
GCS = ["gcsfs>=2026.10.1"]

EXTRAS = {
    "lm": LM,
    "grain": GRAIN,
    "gcs": GCS,
    # xmanager needs protobuf<7; without these pins pip walks back through every
    # google-cloud-bigquery release looking for a protobuf-6 world (>15 min, never ends).
    "launch": [
        "xmanager==0.8.5",
        "protobuf>=6.33.5,<7",
        "google-cloud-aiplatform==2.7.0",
        "google-cloud-bigquery==3.47.0"],
    # Accelerator builds of jaxlib (the base install is CPU-only).
    "cuda": ["jax[cuda12]>=0.10.2,<0.13"] + GCS,
    "tpu": ["jax[tpu]>=0.10.2,<0.13"] + GCS,
    # The test suite without TensorFlow: the Grain path's packages (tests/e2e/test_c4_grain.py
    # writes and reads its ArrayRecord files without TensorFlow); the seqio tests
    # (tests/tasks/test_c4.py, tests/e2e/test_c4_train.py) skip, saying so, unless [lm] is installed
    # too (CI runs them with every extra: .ci/run). tests/e2e/test_gcs.py runs gs:// workdirs
    # against a local GCS emulator. ruff: the linter CI runs first (`ruff check --config
    # .ci/ruff.toml .`). wheel: tests/repo/test_install.py builds one without build isolation
    # (setuptools < 70 needs the package for bdist_wheel; TensorFlow's dependencies brought it
    # before [dev] went TensorFlow-free).
    "dev": ["pytest>=9,<10", "pytest-xdist>=3.8,<4", "gcp-storage-emulator==2026.7.19",
            "ruff>=0.17.6,<0.18", "wheel>=0.43"]
           + GRAIN + GCS}

setuptools.setup(
    name="hypernet-attention", version="0.1.0",
    description=("Attention as a Hypernetwork: multi-head attention, HYLA and ablations in "
                 "JAX/Flax."), python_requires=">=3.11",
    # The interpreters the test suite is run on (reference.md, "Versions"; CI: .ci/run).
    classifiers=[
        "Programming Language :: Python :: 3.11",
        "Programming Language :: Python :: 3.12",
        "Programming Language :: Python :: 3.13"],
    packages=setuptools.find_packages(include=["hypernet_attention", "hypernet_attention.*"])
    + ["hypernet_attention.configs"],
    # The experiment configs, so that `registry` finds them in an install without -e.
    package_dir={"hypernet_attention.configs": "experiments/configs"}, install_requires=BASE,
    extras_require=EXTRAS)

"""hypernet-attention: Attention as a Hypernetwork (Schug et al., ICLR 2025) in JAX/Flax.

Tested together on Python 3.11 (2026-11): jax 0.10.2, flax 0.12.8, optax 0.2.8,
orbax-checkpoint 0.12.8, chex 0.1.92, ml-collections 1.1.0, clu 0.0.12, tensorflow 2.21
(CLU's TensorBoard writer), tensorflow-datasets 4.9.10, seqio 0.0.20, pytest 9.2.
"""

import setuptools

BASE = [
    "jax>=0.10.2,<0.11",
    "flax>=0.12.8,<0.13",
    "optax>=0.2.8,<0.3",
    "orbax-checkpoint>=0.12.8,<0.13",
    "chex>=0.1.92,<0.2",
    "ml-collections>=1.1,<2",
    "clu==0.0.12",
    # CLU's SummaryWriter writes TensorBoard events through tf.summary.
    "tensorflow>=2.21,<2.22",
    "tensorboard>=2.21,<2.22",
    "matplotlib>=3.9",
    "numpy>=2.0",
    "scikit-learn>=1.9,<2", "scipy>=1.17,<2", "tqdm>=4.66,<5",  # latent-code probing
]

EXTRAS = {
    "lm": [
        "tensorflow-text>=2.21,<2.22",
        "tensorflow-datasets>=4.9.10,<5",
        "seqio==0.0.20",
        "sentencepiece>=0.2,<0.3",
    ],
    "launch": ["xmanager>=0.8.5,<0.9"],
    # Accelerator builds of jaxlib (the base install is CPU-only).
    "cuda": ["jax[cuda12]>=0.10.2,<0.11"],
    "tpu": ["jax[tpu]>=0.10.2,<0.11"],
    "dev": [
        "pytest>=9,<10",
        "pytest-xdist>=3.8,<4",
        "tensorflow-datasets>=4.9.10,<5",
    ],
}

setuptools.setup(
    name="hypernet-attention",
    version="0.1.0",
    description="Attention as a Hypernetwork: multi-head attention, HYLA and ablations in JAX/Flax.",
    python_requires=">=3.11",
    packages=setuptools.find_packages(include=["hypernet_attention", "hypernet_attention.*"]),
    install_requires=BASE,
    extras_require=EXTRAS,
)

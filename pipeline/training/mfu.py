"""The peak FLOP/s of this machine, timed on a large matmul: model FLOP utilisation (MFU)
is relative to it (pretraining logs and `make bench-train`).
"""

from __future__ import annotations

import time

import tensorflow as tf

PEAK_DTYPES = {"float32": tf.float32, "mixed_bfloat16": tf.bfloat16,
               "mixed_float16": tf.float16}


def measure_peak_flops(seconds: float = 1.0, dtype=tf.float32, size: int = 2048) -> float:
    """FLOP/s of a large square matmul on the default device, timed for about `seconds`.

    The best of several timed rounds (other processes share the machine): the rate MFU is
    relative to. 2·n³ FLOPs per matmul.
    """
    a = tf.random.normal((size, size), dtype=tf.float32)
    a, b = tf.cast(a, dtype), tf.cast(tf.transpose(a), dtype)

    @tf.function
    def matmuls(a, b, n):
        total = tf.zeros((), tf.float32)
        for _ in tf.range(n):
            total += tf.cast(tf.reduce_sum(tf.matmul(a, b)[:1, :1]), tf.float32)
        return total

    matmuls(a, b, tf.constant(1)).numpy()  # trace and warm up
    start = time.perf_counter()
    matmuls(a, b, tf.constant(1)).numpy()
    once = max(time.perf_counter() - start, 1e-6)
    per_round = max(1, int(seconds / 4 / once))
    best, deadline = 0.0, time.perf_counter() + seconds
    while True:
        start = time.perf_counter()
        matmuls(a, b, tf.constant(per_round)).numpy()
        best = max(best, 2.0 * size ** 3 * per_round / (time.perf_counter() - start))
        if time.perf_counter() >= deadline:
            return best


def onednn_enabled() -> bool:
    """Whether TensorFlow runs its CPU kernels on oneDNN in this process (pipeline/__init__.py
    turns it on before TensorFlow loads; it cannot change afterwards)."""
    from models import keras_compat

    return keras_compat.onednn_enabled()

"""The tf.distribute strategy named by `train.strategy`.

    default       tf.distribute.get_strategy(): one device, whatever TF places on
    one_device    the first GPU if there is one, else the CPU
    mirrored      all local GPUs (or logical CPU devices), synchronous all-reduce
    multi_worker  MultiWorkerMirroredStrategy; the cluster comes from $TF_CONFIG
    tpu           TPUStrategy on `train.tpu` (a TPU name or grpc:// address; "" = local)

The model, optimizer and metrics must be created inside `strategy.scope()`;
`train.batch_size` is the global batch, split evenly across replicas.
"""

from __future__ import annotations

import json
import os

import tensorflow as tf


class StrategyError(ValueError):
    pass


def make_strategy(name: str, tpu: str = "") -> tf.distribute.Strategy:
    if name == "default":
        return tf.distribute.get_strategy()
    if name == "one_device":
        gpus = tf.config.list_logical_devices("GPU")
        return tf.distribute.OneDeviceStrategy(gpus[0].name if gpus else "/cpu:0")
    if name == "mirrored":
        return tf.distribute.MirroredStrategy()
    if name == "multi_worker":
        if "TF_CONFIG" not in os.environ:
            raise StrategyError(
                "train.strategy = 'multi_worker' needs $TF_CONFIG describing the cluster, e.g. "
                'TF_CONFIG=\'{"cluster": {"worker": ["host1:12345", "host2:12345"]}, '
                '"task": {"type": "worker", "index": 0}}\'')
        try:
            json.loads(os.environ["TF_CONFIG"])
        except json.JSONDecodeError as err:
            raise StrategyError(f"$TF_CONFIG is not valid JSON: {err}") from err
        return tf.distribute.MultiWorkerMirroredStrategy()
    if name == "tpu":
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu)
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        return tf.distribute.TPUStrategy(resolver)
    raise StrategyError(f"unknown train.strategy {name!r}")


def is_chief() -> bool:
    """True on the worker that writes checkpoints, exports and MLflow records."""
    config = json.loads(os.environ.get("TF_CONFIG", "{}") or "{}")
    task = config.get("task", {})
    return task.get("type", "worker") in ("chief", "worker") and (
        task.get("type") == "chief" or ("chief" not in config.get("cluster", {})
                                        and task.get("index", 0) == 0))

"""The tf.distribute strategy named by `train.strategy`, and what depends on it.

    default       tf.distribute.get_strategy(): one device, whatever TF places on
    one_device    the first GPU if there is one, else the CPU
    mirrored      all local GPUs; without GPUs, all logical CPU devices (see `split_cpu`)
    multi_worker  MultiWorkerMirroredStrategy; the cluster comes from $TF_CONFIG
    tpu           TPUStrategy on `train.tpu` (a TPU name or grpc:// address; "" = local)

The model, optimizer and metrics must be created inside `strategy.scope()`.
`train.batch_size` is the global batch: each of the `num_replicas_in_sync` replicas
(over all workers) gets `batch_size / replicas` examples per step, so the batch must
divide evenly (`per_replica_batch` checks it). Under `multi_worker` the training data
is sharded per worker by tf.data auto-sharding (`shard_options`); only the chief
(`is_chief`) writes checkpoints, exports and MLflow records.
"""

from __future__ import annotations

import json
import os

import tensorflow as tf


class StrategyError(ValueError):
    pass


def make_strategy(name: str, tpu: str = "", allow_cpu: bool = False) -> tf.distribute.Strategy:
    if name == "default":
        return tf.distribute.get_strategy()
    if name in ("one_device", "mirrored") and not tf.config.list_logical_devices("GPU"):
        if not allow_cpu:
            built = "with" if tf.test.is_built_with_cuda() else "without"
            raise StrategyError(
                f"train.strategy = {name!r} is for GPUs, but TensorFlow (built {built} CUDA) sees "
                f"none; install the GPU build (`make setup GPU=1`, docs/gpu.md) and check the "
                f"driver (nvidia-smi), or set train.allow_cpu=true to run it on the CPU")
    if name == "one_device":
        gpus = tf.config.list_logical_devices("GPU")
        return tf.distribute.OneDeviceStrategy(gpus[0].name if gpus else "/cpu:0")
    if name == "mirrored":
        gpus = tf.config.list_logical_devices("GPU")
        if gpus:
            return tf.distribute.MirroredStrategy()
        # No GPU: mirror over the logical CPU devices (one unless split_cpu() made more).
        cpus = [d.name for d in tf.config.list_logical_devices("CPU")]
        return tf.distribute.MirroredStrategy(
            devices=cpus, cross_device_ops=tf.distribute.ReductionToOneDevice())
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


def split_cpu(n: int) -> None:
    """Splits the CPU into `n` logical devices, so `mirrored` has `n` replicas without GPUs.

    Must run before TensorFlow initialises its devices (before any op runs); for tests
    and for trying a multi-replica setup on a laptop.
    """
    cpus = tf.config.list_physical_devices("CPU")
    try:
        tf.config.set_logical_device_configuration(
            cpus[0], [tf.config.LogicalDeviceConfiguration() for _ in range(n)])
    except RuntimeError as err:
        raise StrategyError(f"cannot split the CPU into {n} logical devices: TensorFlow is "
                            f"already initialised ({err}); call split_cpu() first") from err


def _tf_config() -> dict:
    return json.loads(os.environ.get("TF_CONFIG", "{}") or "{}")


def is_chief() -> bool:
    """True on the worker that writes checkpoints, exports and MLflow records.

    That is the task of type "chief" if the cluster has one, else worker 0 (the
    convention MultiWorkerMirroredStrategy follows); without $TF_CONFIG, this process.
    Evaluators and parameter servers are never the chief.
    """
    config = _tf_config()
    task = config.get("task", {})
    kind, index = task.get("type", "worker"), int(task.get("index", 0))
    if kind == "chief":
        return True
    return kind == "worker" and "chief" not in config.get("cluster", {}) and index == 0


def worker_name() -> str:
    """"worker 1 of 2"-style description of this process in the cluster (for logs)."""
    config = _tf_config()
    if not config:
        return "single worker"
    task = config.get("task", {})
    return f"{task.get('type', 'worker')} {task.get('index', 0)} of {num_workers()}"


def per_replica_batch(global_batch: int, strategy: tf.distribute.Strategy) -> int:
    replicas = strategy.num_replicas_in_sync
    if global_batch % replicas:
        raise StrategyError(
            f"train.batch_size = {global_batch} is the global batch and must divide evenly "
            f"across the {replicas} replicas of {type(strategy).__name__}; use a multiple of "
            f"{replicas} (e.g. {max(replicas, global_batch // replicas * replicas)})")
    return global_batch // replicas


SHARD_POLICIES = {
    "auto": tf.data.experimental.AutoShardPolicy.AUTO,
    "file": tf.data.experimental.AutoShardPolicy.FILE,
    "data": tf.data.experimental.AutoShardPolicy.DATA,
    "off": tf.data.experimental.AutoShardPolicy.OFF,
}


def num_workers() -> int:
    """Workers (chief included) in $TF_CONFIG's cluster; 1 without one."""
    cluster = _tf_config().get("cluster", {})
    return max(1, sum(len(v) for k, v in cluster.items() if k in ("chief", "worker")))


def shard_options(policy: str, num_files: int | None = None) -> tf.data.Options:
    """tf.data options with the auto-shard policy `train.data_sharding` names.

    "auto" is FILE when every worker gets at least one of the `num_files` files, else DATA
    (tf.data's own AUTO fails outright with fewer files than workers).
    """
    if policy == "auto" and num_files is not None:
        policy = "file" if num_files >= num_workers() else "data"
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = SHARD_POLICIES[policy]
    return options

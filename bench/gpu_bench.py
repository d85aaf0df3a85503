"""BERT pretraining throughput on one accelerator: sequences/s and model FLOP utilisation.

Runs the project's own model (models/: BertEncoder + BertPretrainer, MLM on the masked
positions only + NSP) with Keras on JAX by default, WITHOUT TensorFlow, so it runs on a GPU
machine that has JAX but no TensorFlow (carry the keras and keras-hub wheels, installed
with --no-deps). Synthetic batches (random ids; the speed does not depend on the text).

    KERAS_BACKEND=jax python bench/gpu_bench.py                  # BERT-Base, seq 128, bf16, XLA
    KERAS_BACKEND=jax python bench/gpu_bench.py --preset large --batch 128
    KERAS_BACKEND=torch python bench/gpu_bench.py --tiny         # seconds on a CPU: a smoke test

MFU = model FLOPs per second (models/flops.py: encoder, attention, MLM decoder on the
masked positions, NSP; training = 3 × forward) over the rate of a large square matmul in
the same dtype timed on the same device in the same run (not the datasheet peak, which is
also printed when it is known). The steps are timed in `--repeat` windows (default 3) of
`--steps` steps each, after the warm-up, in this one process (there is no peer to alternate
with); the host's load average is printed before each window, and seq/s is the windows'
median (min-max printed). The last line reads `gpu-bench: <seq/s> seq/s mfu <percent> (...)`.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("KERAS_BACKEND", "jax")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from bench import machine, protocol  # noqa: E402  (the load; medians: standard library only)

# Dense bf16 peaks from the vendors' datasheets (TFLOP/s), for the second MFU figure.
DATASHEET_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L4": 121.0}


def build_parser() -> argparse.ArgumentParser:
    """The benchmark's parser (docs/cli.md is generated from it)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="base", help="tiny|mini|small|medium|base|large")
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--predictions", type=int, default=20, help="masked positions/sequence")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=30522)
    parser.add_argument("--precision", default="mixed_bfloat16",
                        help="float32 | mixed_bfloat16 | mixed_float16")
    parser.add_argument("--no-jit", dest="jit", action="store_false", help="no XLA")
    parser.add_argument("--steps", type=int, default=30, help="timed steps")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps (compilation)")
    parser.add_argument("--matmul", type=int, default=8192, help="size of the peak matmul")
    parser.add_argument("--repeat", type=int, default=3,
                        help="timed windows of --steps steps (no peer: one process); seq/s is "
                             "their median, min-max printed")
    parser.add_argument("--tiny", action="store_true",
                        help="a 1-layer model, seq 32, batch 8, 2 steps, no XLA: checks it runs "
                             "(CPU)")
    return parser


def parse_args(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.tiny:
        args.preset, args.seq, args.predictions, args.batch, args.vocab = "tiny", 32, 5, 8, 1000
        args.steps, args.warmup, args.matmul = 2, 1, 256
        args.jit = False  # torch.compile alone takes minutes on a CPU
    if args.repeat < 1 or args.steps < 1:
        parser.error(f"--repeat and --steps must be >= 1, got {args.repeat}, {args.steps}")
    return args


def synthetic_batch(batch, seq, predictions, vocab, seed=0):
    rng = np.random.default_rng(seed)
    x = {
        "token_ids": rng.integers(999, vocab, (batch, seq)).astype("int32")
        if vocab > 1000 else rng.integers(5, vocab, (batch, seq)).astype("int32"),
        "segment_ids": (np.arange(seq)[None, :] >= seq // 2).repeat(batch, 0).astype("int32"),
        "padding_mask": np.ones((batch, seq), "int32"),
        "mask_positions": np.sort(rng.choice(np.arange(1, seq), (batch, predictions)), axis=1)
        .astype("int32"),
    }
    y = {"mlm": rng.integers(5, vocab, (batch, predictions)).astype("int32"),
         "nsp": rng.integers(0, 2, (batch,)).astype("int32")}
    sample_weight = {"mlm": np.ones((batch, predictions), "float32"),
                     "nsp": np.ones((batch,), "float32")}
    return x, y, sample_weight


def sync(value):
    import keras

    return keras.ops.convert_to_numpy(value)


def measure_peak(size, dtype, seconds=2.0):
    """FLOP/s of `size`² matmuls in `dtype` (best of several timed rounds)."""
    import keras
    from keras import ops

    a = ops.cast(keras.random.normal((size, size), seed=1), dtype)
    b = ops.cast(keras.random.normal((size, size), seed=2), dtype)
    sync(ops.sum(ops.matmul(a, b)[:1, :1]))  # warm up
    best, deadline, rounds = 0.0, time.perf_counter() + seconds, 4
    while time.perf_counter() < deadline:
        start = time.perf_counter()
        acc = None
        for _ in range(rounds):
            c = ops.matmul(a, b)
            acc = c[:1, :1] if acc is None else acc + c[:1, :1]
        sync(acc)
        elapsed = time.perf_counter() - start
        best = max(best, 2.0 * size ** 3 * rounds / elapsed)
        if elapsed < 0.2:
            rounds *= 2
    return best


def device_name():
    import keras

    if keras.backend.backend() == "jax":
        import jax

        device = jax.devices()[0]
        return f"{device.platform}:{getattr(device, 'device_kind', '')}"
    if keras.backend.backend() == "torch":
        import torch

        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    return keras.backend.backend()


def main(argv=None) -> dict:
    args = parse_args(argv)
    import keras

    from models import presets
    from models.bert import BertEncoder
    from models.flops import training_flops_per_sequence
    from models.pretraining import BertPretrainer

    with_tf = sys.modules.get("tensorflow") is not None
    print(f"gpu-bench: keras {keras.__version__} on {keras.backend.backend()}, "
          f"device {device_name()}, TensorFlow imported: {with_tf}", flush=True)
    arch = dict(presets.PRESETS[args.preset])
    if args.tiny:
        arch.update(num_layers=1, hidden_dim=32, num_heads=2, intermediate_dim=64)
    keras.utils.set_random_seed(0)
    dtype = None if args.precision == "float32" else args.precision
    encoder = BertEncoder(vocabulary_size=args.vocab, max_sequence_length=max(512, args.seq),
                          dtype=dtype, **arch)
    model = BertPretrainer(encoder)
    optimizer = keras.optimizers.AdamW(1e-4, weight_decay=0.01, epsilon=1e-6,
                                       global_clipnorm=1.0)
    if args.precision == "mixed_float16":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    model.compile(optimizer=optimizer, jit_compile=args.jit)
    x, y, sample_weight = synthetic_batch(args.batch, args.seq, args.predictions, args.vocab)

    start = time.perf_counter()
    for _ in range(args.warmup):
        loss = model.train_on_batch(x, y, sample_weight)
    print(f"gpu-bench: {args.warmup} warm-up step(s) (compilation) in "
          f"{time.perf_counter() - start:.1f} s", flush=True)
    rates = []
    for index in range(args.repeat):  # the windows: the same model, one after the other
        load = machine.load()
        start = time.perf_counter()
        for _ in range(args.steps):
            loss = model.train_on_batch(x, y, sample_weight)
        loss = float(np.ravel(loss)[0])  # waits for the last step
        elapsed = time.perf_counter() - start
        rates.append(args.steps * args.batch / elapsed)
        print(f"gpu-bench: window {index + 1}/{args.repeat} (host load average {load:.2f}): "
              f"{args.steps} steps in {elapsed:.2f} s, {rates[-1]:,.1f} seq/s", flush=True)
    seq_per_s = protocol.spread(rates)["median"]

    peak_dtype = {"float32": "float32", "mixed_bfloat16": "bfloat16",
                  "mixed_float16": "float16"}[args.precision]
    peak = measure_peak(args.matmul, peak_dtype, seconds=0.5 if args.tiny else 2.0)
    flops = training_flops_per_sequence(
        num_layers=arch["num_layers"], hidden_dim=arch["hidden_dim"],
        intermediate_dim=arch["intermediate_dim"], vocabulary_size=args.vocab,
        seq_length=args.seq, num_predictions=args.predictions)
    mfu = seq_per_s * flops / peak
    sheet = next((v for k, v in DATASHEET_BF16_TFLOPS.items() if k in device_name()), None)
    sheet_text = (f", {seq_per_s * flops / (sheet * 1e12):.1%} of the {sheet:g} TFLOP/s "
                  f"datasheet bf16 peak" if sheet and peak_dtype == "bfloat16" else "")
    result = {"preset": args.preset, "seq": args.seq, "batch": args.batch,
              "precision": args.precision, "jit": args.jit, "seq_per_second": seq_per_s,
              "tokens_per_second": seq_per_s * args.seq, "model_tflops": seq_per_s * flops / 1e12,
              "peak_tflops": peak / 1e12, "mfu": mfu, "loss": loss,
              "seq_per_second_windows": protocol.spread(rates), "tensorflow_imported": with_tf}
    print(f"gpu-bench: BERT-{args.preset} seq {args.seq} batch {args.batch} {args.precision}"
          f"{' +XLA' if args.jit else ''}: {args.repeat} x {args.steps} steps, seq/s median "
          f"(min-max) {protocol.spread_text(rates, ',.1f')}, loss {loss:.3f}; "
          f"model {seq_per_s * flops / 1e12:.1f} TFLOP/s, {peak_dtype} matmul "
          f"{peak / 1e12:.1f} TFLOP/s{sheet_text}", flush=True)
    print(f"gpu-bench: {seq_per_s:,.1f} seq/s mfu {100 * mfu:.1f} "
          f"(BERT-{args.preset} seq {args.seq} {args.precision}, {device_name()})", flush=True)
    return result


if __name__ == "__main__":
    main()

"""Training throughput of our pretraining step vs Hugging Face transformers, and MFU, on this CPU.

    make bench-train                        # BERT-mini and BERT-small, ~10 minutes on 2 cores
    python bench/bench_train.py --models small --steps 5

Same setup for every contender (the issue's): seq 128, batch 32, 20 masked positions per
sequence, vocabulary 30,522, dropout 0.1, AdamW, float32; synthetic batches (random ids;
the speed does not depend on the text) fed from memory.

- ours: the pretrain stage's building blocks (pipeline/stages/pretrain.py: build_model,
  build_optimizer, compile_model with our train step, gradient clipping), `model.fit` on a
  repeated tf.data batch; MLM logits on the masked positions only; the pipeline's defaults
  (`train.fused_kernels=true`: models/fused.py's GELU, LayerNorm and attention projections;
  `train.jit_compile=auto`: on a CPU the step outside XLA, its optimizer update and gradient
  norm XLA-compiled), and in float32 also with `train.fused_kernels=false` (Keras' own ops:
  then `auto` XLA-compiles the whole float32 step, the default before models/fused.py);
  `--jit false` for the plain graph everywhere. Our float32 figure is the default step.
- transformers, same work (the headline peer): transformers' `BertModel` + `BertPreTrainingHeads`
  with the masked positions gathered before the MLM head, as ours and Google's do; eager, and
  under `torch.compile` (the faster of the two is compared with); torch.optim.AdamW, clipping.
- transformers, stock: `BertForPreTraining` as users run it (vocabulary logits at every
  position, loss on the masked ones via -100 labels): more work per token (on BERT-small about
  174 vs 94 MFLOP), shown as a second row, not compared with.
- peak: the best rate of a large float32 (and bfloat16) matmul, timed in the same run
  before and after the models (the higher of the two counts).

tokens/s counts every position of every sequence (batch × 128 per step). MFU = our model
FLOPs per second (models/flops.py: encoder, attention, MLM decoder on the masked positions,
NSP; training = 3 × forward) / the matmul peak of the same dtype. The contenders alternate
(ours, theirs, ours bf16, per model) and each is timed over `--steps` steps after
`--warmup` untimed ones; `--repeat N` runs N such rounds and keeps each contender's best,
printing the spread (best/worst - 1): the noise on a shared machine is about 10%.
bf16/fp32 is our mixed_bfloat16 tokens/s over our default float32 step (and, on its own
line, over the fused-kernels-off one). `--curve-steps 200` then trains BERT-small 200 steps in
float32 and in mixed_bfloat16 from the same weights on the same learnable synthetic
batches (each id follows its predecessor by a fixed random map 3 times in 4) and prints both
loss curves, means over 20 steps, and their largest difference (tolerance 0.05 nats).
Also printed: the ceiling, the tokens/s of every model FLOP at the float32 matmul peak (MFU 100%),
and its ratio to transformers' figure: no float32 build of the same model beats it here.
The last line reads `bench-train: vs-transformers <x> mfu <y>`: x = our float32 tokens/s
over the same-work transformers peer's on BERT-small, y = our float32 MFU on BERT-small, in
percent. The CPU's model and its avx2/avx512/bf16/AMX flags are printed first; bf16/fp32 is
`n/a` on a CPU without bfloat16 units.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from bench import machine  # noqa: E402

import pipeline  # noqa: E402,F401  (before TensorFlow loads: its oneDNN switch, as training's)

VOCAB, SEQ, PREDICTIONS, BATCH = 30522, 128, 20, 32


def build_parser() -> argparse.ArgumentParser:
    """The benchmark's parser (docs/cli.md is generated from it)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="mini,small", help="comma-separated presets")
    parser.add_argument("--steps", type=int, default=8, help="timed steps per contender")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    parser.add_argument("--batch", type=int, default=BATCH)
    parser.add_argument("--no-bf16", dest="bf16", action="store_false")
    parser.add_argument("--no-transformers", dest="transformers", action="store_false")
    parser.add_argument("--jit", default="auto", choices=("auto", "true", "false"),
                        help="train.jit_compile for ours (auto, the pipeline's default: XLA on "
                             "for one replica)")
    parser.add_argument("--peak-seconds", type=float, default=2.0)
    parser.add_argument("--repeat", type=int, default=1,
                        help="rounds of every contender (the noise here is about 10%%): the "
                             "best round counts, and the spread (worst/best) is printed")
    parser.add_argument("--curve-steps", type=int, default=0,
                        help="also train BERT-small this many steps in float32 and in "
                             "mixed_bfloat16 on the same learnable synthetic batches and "
                             "compare the loss curves (200: ~15 min on 2 cores)")
    parser.add_argument("--no-compile", dest="compile", action="store_false",
                        help="skip the torch.compile variant of the same-work transformers peer")
    return parser


def parse_args(argv=None):
    parser = build_parser()
    return parser.parse_args(argv)


def synthetic(batch, seed=0):
    rng = np.random.default_rng(seed)
    return masked(rng.integers(999, VOCAB, (batch, SEQ)).astype("int32"), rng)


def masked(ids, rng) -> dict:
    """`ids` (sequences, SEQ) with PREDICTIONS random positions masked, two segments, random
    NSP labels."""
    count = len(ids)
    positions = np.sort(np.stack([rng.choice(np.arange(1, SEQ - 1), PREDICTIONS, replace=False)
                                  for _ in range(count)]), axis=1).astype("int32")
    labels = np.take_along_axis(ids, positions, axis=1)
    ids_masked = ids.copy()
    np.put_along_axis(ids_masked, positions, 103, axis=1)
    segments = (np.arange(SEQ)[None, :] >= SEQ // 2).repeat(count, 0).astype("int32")
    nsp = rng.integers(0, 2, count).astype("int32")
    return dict(ids=ids_masked, segments=segments, positions=positions, labels=labels, nsp=nsp)


def bench_ours(preset, data, steps, warmup, precision="float32", jit="auto", batches=None,
               overrides=()):
    import keras
    import tensorflow as tf

    from pipeline import config as config_lib
    from pipeline.training import pretrainer

    batch = len(data["ids"]) if batches is None else batches[0]["token_ids"].shape[1]
    config = config_lib.load(None, [
        f"model.preset={preset}", "model.dropout=0.1", f"train.batch_size={batch}",
        f"train.steps={warmup + steps}", "train.warmup_steps=1", "train.learning_rate=0.0001",
        f"train.precision={precision}", f"train.jit_compile={jit}",
        f"data.max_seq_length={SEQ}", f"data.max_predictions_per_seq={PREDICTIONS}",
        *overrides])
    keras.utils.set_random_seed(0)
    model = pretrainer.build_model(config, VOCAB)
    optimizer = pretrainer.build_optimizer(config.train)
    pretrainer.compile_model(model, optimizer, config.train.jit_compile)
    optimizer.build(model.trainable_variables)
    if batches is None:
        x = {"token_ids": data["ids"], "segment_ids": data["segments"],
             "padding_mask": np.ones_like(data["ids"]), "mask_positions": data["positions"]}
        y = {"mlm": data["labels"], "nsp": data["nsp"]}
        sw = {"mlm": np.ones(data["labels"].shape, "float32"), "nsp": np.ones(batch, "float32")}
        dataset = tf.data.Dataset.from_tensors((x, y, sw))
    else:  # the loss-curve check: a sequence of batches (learnable), in order
        dataset = tf.data.Dataset.from_tensor_slices(batches)
    dataset = dataset.map(pretrainer.normalize_mlm_weights).cache().repeat().prefetch(2)

    times, losses, means = [], [], []

    class Clock(keras.callbacks.Callback):
        def on_train_batch_end(self, batch_index, logs=None):
            times.append(time.perf_counter())
            if batches is not None:  # Keras logs the running mean: undo it, per step
                mean, n = float(np.ravel(logs["loss"])[0]), len(times)
                losses.append(n * mean - (n - 1) * means[-1] if means else mean)
                means.append(mean)

    model.fit(dataset, steps_per_epoch=warmup + steps, epochs=1, verbose=0, callbacks=[Clock()],
              shuffle=False)
    elapsed = times[-1] - times[warmup - 1]
    loss = float(np.ravel(model.get_metrics_result()["loss"])[0])
    return {"losses": losses, "tokens_per_second": steps * batch * SEQ / elapsed,
            "step_seconds": np.diff(times[warmup - 1:]),
            "seconds_per_step": elapsed / steps, "loss": loss, "parameters": model.count_params(),
            "note": f"XLA {'on' if model.jit_compile else 'off'}"
                    + (", update in XLA" if getattr(model, "xla_update", False) else "")
                    + (", fused kernels" if getattr(model, "fused_kernels", False) else "")}


def _hf_config(preset):
    import transformers

    from models import presets

    arch = presets.PRESETS[preset]
    return transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=arch["hidden_dim"], num_hidden_layers=arch["num_layers"],
        num_attention_heads=arch["num_heads"], intermediate_size=arch["intermediate_dim"],
        hidden_act="gelu", max_position_embeddings=512, type_vocab_size=2)


def _same_work_model(config):
    """transformers' BERT doing our work: the encoder, the pooler, then the MLM head (transform
    + decoder tied to the token embedding) on the masked positions only, gathered first, as
    Google's and our pretraining do; `BertForPreTraining` runs the decoder at every position.
    Built from transformers' own modules (BertModel, BertPreTrainingHeads)."""
    import torch
    from transformers.models.bert import modeling_bert

    class SameWork(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bert = modeling_bert.BertModel(config)
            self.cls = modeling_bert.BertPreTrainingHeads(config)
            # Tied as BertForPreTraining ties them: the token embedding, one output bias.
            self.cls.predictions.decoder.weight = self.bert.embeddings.word_embeddings.weight
            self.cls.predictions.decoder.bias = self.cls.predictions.bias
            self.loss = torch.nn.CrossEntropyLoss()

        def forward(self, input_ids, token_type_ids, attention_mask, positions, labels,
                    next_sentence_label):
            sequence, pooled = self.bert(input_ids=input_ids, token_type_ids=token_type_ids,
                                         attention_mask=attention_mask, return_dict=False)[:2]
            index = positions.unsqueeze(-1).expand(-1, -1, sequence.shape[-1])
            mlm, nsp = self.cls(torch.gather(sequence, 1, index), pooled)
            return (self.loss(mlm.reshape(-1, mlm.shape[-1]), labels.reshape(-1))
                    + self.loss(nsp, next_sentence_label))

    return SameWork()


def bench_transformers(preset, data, steps, warmup, variant="stock"):
    """variant: `stock` (BertForPreTraining, vocabulary logits at every position, as users run
    it), `same_work` (the decoder on the masked positions only: our work), `same_work_compiled`
    (that under torch.compile)."""
    import torch
    import transformers

    config = _hf_config(preset)
    torch.manual_seed(0)
    ids = torch.tensor(data["ids"], dtype=torch.long)
    common = dict(input_ids=ids, token_type_ids=torch.tensor(data["segments"], dtype=torch.long),
                  attention_mask=torch.ones_like(ids),
                  next_sentence_label=torch.tensor(data["nsp"], dtype=torch.long))
    if variant == "stock":
        model = transformers.BertForPreTraining(config)
        labels = torch.full_like(ids, -100)
        labels.scatter_(1, torch.tensor(data["positions"], dtype=torch.long),
                        torch.tensor(data["labels"], dtype=torch.long))
        batch = dict(common, labels=labels)
        step_loss = lambda: model(**batch).loss  # noqa: E731
    else:
        model = _same_work_model(config)
        batch = dict(common, positions=torch.tensor(data["positions"], dtype=torch.long),
                     labels=torch.tensor(data["labels"], dtype=torch.long))
        forward = torch.compile(model) if variant == "same_work_compiled" else model
        step_loss = lambda: forward(**batch)  # noqa: E731
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, eps=1e-6)
    times = []
    for _ in range(warmup + steps):
        optimizer.zero_grad(set_to_none=True)
        loss = step_loss()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        times.append(time.perf_counter())
    elapsed = times[-1] - times[warmup - 1]
    return {"tokens_per_second": steps * len(ids) * SEQ / elapsed,
            "seconds_per_step": elapsed / steps, "loss": float(loss.detach()),
            "parameters": sum(p.numel() for p in model.parameters()),
            "note": f"{variant}, torch {torch.__version__}, transformers "
                    f"{transformers.__version__}"}


def transformers_missing() -> str:
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as err:
        return (f"{err.name} is not installed ({err}); install the bench extra: pip install "
                f"torch==2.13.0 transformers (the CPU wheel of torch)")
    return ""


def main(argv=None) -> dict:
    args = parse_args(argv)
    import tensorflow as tf

    from models import presets
    from models.flops import training_flops_per_token
    from pipeline.training.mfu import measure_peak_flops, onednn_enabled

    model, flags = machine.cpu_facts(machine.CPU_FLAGS + ("amx_tile",))
    bf16_units = machine.has_bf16_units()
    print(f"bench-train: CPU {model}; flags: " + machine.flags_text(flags, ", "), flush=True)
    missing = transformers_missing() if args.transformers else "skipped (--no-transformers)"
    if missing:
        print(f"bench-train: transformers: {missing}; reporting ours alone", flush=True)
    print(f"bench-train: {machine.cores()} CPUs, TensorFlow {tf.__version__} (oneDNN "
          f"{'on' if onednn_enabled() else 'off'}); seq {SEQ}, batch "
          f"{args.batch}, {PREDICTIONS} masked positions, vocab {VOCAB}, {args.steps} timed steps",
          flush=True)
    peaks = {"float32": measure_peak_flops(args.peak_seconds, tf.float32)}
    if args.bf16:
        peaks["bfloat16"] = measure_peak_flops(args.peak_seconds, tf.bfloat16)
    print("bench-train: matmul peak " + ", ".join(f"{k} {v / 1e9:,.0f} GFLOP/s"
                                                  for k, v in peaks.items()), flush=True)
    data = synthetic(args.batch)
    results = {}
    for preset in args.models.split(","):
        arch = presets.PRESETS[preset]
        per_token = training_flops_per_token(
            num_layers=arch["num_layers"], hidden_dim=arch["hidden_dim"],
            intermediate_dim=arch["intermediate_dim"], vocabulary_size=VOCAB, seq_length=SEQ,
            num_predictions=PREDICTIONS)
        row = {"flops_per_token": per_token}
        contenders = [("ours", "ours float32",
                       lambda: bench_ours(preset, data, args.steps, args.warmup, jit=args.jit))]
        if args.jit == "auto":  # the step before models/fused.py: Keras' ops, XLA on a CPU
            contenders.append(("ours_keras", "ours float32, fused kernels off", lambda: bench_ours(
                preset, data, args.steps, args.warmup, overrides=["train.fused_kernels=false"])))
        if not missing:
            for key, variant in TRANSFORMERS_VARIANTS:
                if variant == "same_work_compiled" and not args.compile:
                    continue
                contenders.append((key, f"transformers {variant}", functools.partial(
                    bench_transformers, preset, data, args.steps, args.warmup, variant)))
        if args.bf16:
            contenders.append(("ours_bf16", "ours mixed_bfloat16", lambda: bench_ours(
                preset, data, args.steps, args.warmup, precision="mixed_bfloat16",
                jit=args.jit)))
        rounds = {}
        for _ in range(args.repeat):  # rounds alternate the contenders: load drifts hit all
            for key, name, run in contenders:
                try:
                    result = run()
                except Exception as err:  # noqa: BLE001 - torch.compile needs a C++ toolchain
                    print(f"bench-train: {preset} {name}: n/a "
                          f"({type(err).__name__}: {str(err).splitlines()[0][:160]})", flush=True)
                    continue
                report(preset, name, result, per_token, note=result["note"])
                rounds.setdefault(key, []).append(result)
        for key, results_of in rounds.items():
            best = max(results_of, key=lambda r: r["tokens_per_second"])
            worst = min(r["tokens_per_second"] for r in results_of)
            row[key] = {**best, "spread": best["tokens_per_second"] / worst - 1}
        # The peer doing our work, the faster of its variants, is the one compared with.
        same = [row[k] for k in ("transformers_same", "transformers_same_compiled") if k in row]
        if same:
            row["transformers"] = max(same, key=lambda r: r["tokens_per_second"])
        # Ours in float32: the pipeline's default step.
        row["ours_fp32"] = row["ours"]
        results[preset] = row

    # The peak again after the models (the machine's load changes): the higher one counts.
    peaks["float32"] = max(peaks["float32"], measure_peak_flops(args.peak_seconds, tf.float32))
    if args.bf16:
        peaks["bfloat16"] = max(peaks["bfloat16"],
                                measure_peak_flops(args.peak_seconds, tf.bfloat16))
    print("bench-train: matmul peak (best of before/after) " + ", ".join(
        f"{k} {v / 1e9:,.0f} GFLOP/s" for k, v in peaks.items()), flush=True)
    print(f"{'model':<7}{'contender':<34}{'tokens/s':>10}{'spread':>8}{'s/step':>8}"
          f"{'model GFLOP/s':>15}{'MFU':>7}{'vs same-work':>14}{'bf16/fp32':>11}")
    for preset, row in results.items():
        theirs = row.get("transformers", {}).get("tokens_per_second")
        for name, key, dtype in (("ours float32", "ours", "float32"),
                                 ("ours float32, fused kernels off", "ours_keras", "float32"),
                                 ("transformers same work", "transformers_same", "float32"),
                                 ("transformers same work, compiled", "transformers_same_compiled",
                                  "float32"),
                                 ("transformers stock (more work)", "transformers_stock",
                                  "float32"),
                                 ("ours mixed_bfloat16", "ours_bf16", "bfloat16")):
            if key not in row:
                continue
            tps = row[key]["tokens_per_second"]
            rate = tps * row["flops_per_token"]  # our model's FLOPs (the stock peer does more)
            row[key]["mfu"] = rate / peaks[dtype]
            ratio = (f"{tps / theirs:.2f}x" if theirs and key.startswith("ours") else "-")
            bf16 = (f"{tps / row['ours_fp32']['tokens_per_second']:.2f}x" if key == "ours_bf16"
                    and bf16_units else "n/a" if key == "ours_bf16" else "-")
            print(f"{preset:<7}{name:<34}{tps:>10,.0f}{row[key]['spread']:>8.1%}"
                  f"{row[key]['seconds_per_step']:>8.2f}{rate / 1e9:>15,.1f}"
                  f"{row[key]['mfu']:>7.1%}{ratio:>14}{bf16:>11}")
        if "ours_bf16" in row and bf16_units:
            bf16 = row["ours_bf16"]["tokens_per_second"]
            print(f"bench-train: {preset} bf16/fp32 "
                  f"{bf16 / row['ours_fp32']['tokens_per_second']:.2f} against our default "
                  f"float32 step" + (f", {bf16 / row['ours_keras']['tokens_per_second']:.2f} "
                                     "against the one with train.fused_kernels=false"
                                     if "ours_keras" in row else ""), flush=True)
    if not bf16_units and args.bf16:
        print("bench-train: bf16/fp32 n/a: this CPU has no bfloat16 units (no avx512_bf16 or "
              "amx_bf16 flag); bfloat16 is emulated in float32 here", flush=True)
    # What no float32 implementation of the same model can beat on this machine: every model
    # FLOP at the matmul peak (MFU 100%), and that rate over the transformers figure.
    for preset, row in results.items():
        ceiling = peaks["float32"] / row["flops_per_token"]
        theirs = row.get("transformers", {}).get("tokens_per_second")
        print(f"bench-train: {preset} ceiling (every model FLOP at the float32 matmul peak): "
              f"{ceiling:,.0f} tokens/s" + (f" = {ceiling / theirs:.2f}x transformers"
                                            if theirs else ""), flush=True)
    summary = results.get("small") or results[list(results)[-1]]
    theirs = summary.get("transformers", {}).get("tokens_per_second")
    ours = summary["ours_fp32"]
    vs = f"{ours['tokens_per_second'] / theirs:.2f}" if theirs else "n/a"
    if args.curve_steps:
        curve_check(args)
    print(f"bench-train: vs-transformers {vs} mfu {100 * ours['mfu']:.1f}", flush=True)
    return {"peaks": peaks, "results": results}


def learnable_batches(count, batch, seed=1):
    """`count` batches of text with structure a model can learn: each id follows its
    predecessor by a fixed random map 3 times in 4 (else a Zipf draw over 5,000 ids), masked
    as `synthetic` is."""
    rng = np.random.default_rng(seed)
    follow = rng.integers(999, 6000, VOCAB)
    zipf = 1.0 / np.arange(1, 5001)
    ids = np.empty((count * batch, SEQ), "int32")
    ids[:, 0] = 101
    ids[:, 1] = 999 + rng.choice(5000, count * batch, p=zipf / zipf.sum())
    for t in range(2, SEQ):
        fresh = 999 + rng.choice(5000, count * batch, p=zipf / zipf.sum())
        ids[:, t] = np.where(rng.random(count * batch) < 0.75, follow[ids[:, t - 1]], fresh)
    data = masked(ids, rng)
    shape = lambda a: a.reshape(count, batch, *a.shape[1:])  # noqa: E731
    x = {"token_ids": shape(data["ids"]), "segment_ids": shape(data["segments"]),
         "padding_mask": shape(np.ones_like(data["ids"])),
         "mask_positions": shape(data["positions"])}
    y = {"mlm": shape(data["labels"]), "nsp": shape(data["nsp"])}
    sw = {"mlm": np.ones(y["mlm"].shape, "float32"), "nsp": np.ones(y["nsp"].shape, "float32")}
    return x, y, sw


def curve_check(args, tolerance=0.05):
    """BERT-small in float32 and in mixed_bfloat16 for `--curve-steps` steps from the same
    weights on the same learnable batches: the loss curves (means over 20 steps) must agree
    within `tolerance` (nats)."""
    steps = args.curve_steps
    batches = learnable_batches(min(steps, 50), args.batch)
    curves = {}
    for precision in ("float32", "mixed_bfloat16"):
        result = bench_ours("small", None, steps - 1, 1, precision=precision, jit=args.jit,
                            batches=batches)
        curves[precision] = np.array(result["losses"])
        print(f"bench-train: curve {precision}: {steps} steps, loss {curves[precision][0]:.3f}"
              f" -> {curves[precision][-20:].mean():.3f} (last 20), "
              f"{result['tokens_per_second']:,.0f} tokens/s [{result['note']}]", flush=True)
    windows = [slice(i, i + 20) for i in range(0, steps, 20)]
    fp32 = np.array([curves["float32"][w].mean() for w in windows])
    bf16 = np.array([curves["mixed_bfloat16"][w].mean() for w in windows])
    worst = float(np.max(np.abs(fp32 - bf16)))
    for name, curve in (("float32 ", fp32), ("bfloat16", bf16)):
        print(f"bench-train: curve (mean loss per 20 steps) {name} "
              + " ".join(f"{v:.3f}" for v in curve), flush=True)
    print(f"bench-train: curve bf16 vs fp32: largest difference {worst:.3f} nats "
          f"({'within' if worst <= tolerance else 'OUTSIDE'} {tolerance})", flush=True)
    return worst


# (row key, bench_transformers variant): the stock model users run, and the peer doing our work
TRANSFORMERS_VARIANTS = (("transformers_stock", "stock"), ("transformers_same", "same_work"),
                         ("transformers_same_compiled", "same_work_compiled"))


def report(preset, name, result, per_token, note=""):
    rate = per_token * result["tokens_per_second"] / 1e9
    print(f"bench-train: {preset} {name}: {result['tokens_per_second']:,.0f} tokens/s "
          f"({result['seconds_per_step']:.2f} s/step, {rate:,.1f} model GFLOP/s, loss "
          f"{result['loss']:.3f}, {result['parameters']:,} parameters)"
          + (f" [{note}]" if note else ""), flush=True)


if __name__ == "__main__":
    main()

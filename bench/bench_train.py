"""Training throughput of our pretraining step vs Hugging Face transformers, and MFU, on this CPU.

    make bench-train                        # BERT-mini and BERT-small, 3 rounds, ~30 min on 2 cores
    python bench/bench_train.py --models small --steps 5 --repeat 5
    python bench/bench_train.py --quick     # BERT-tiny, 2 steps, 2 rounds: try it

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
- peak: the best rate of a large float32 (and bfloat16) matmul, timed in every round in a
  process of its own (the best of the rounds counts).

tokens/s counts every position of every sequence (batch × 128 per step). MFU = our model
FLOPs per second (models/flops.py: encoder, attention, MLM decoder on the masked positions,
NSP; training = 3 × forward) / the matmul peak of the same dtype (the best of the rounds).
The race runs in `--repeat` rounds (bench/protocol.py, default 3): in each, the matmul peak and
then, per model, every contender once (ours, ours with fused kernels off, the transformers
variants, ours bf16), each in a fresh process, in the same order; each is timed over
`--steps` steps after `--warmup` untimed ones. The thread pools of every side are pinned to
`--threads` (TensorFlow intra/inter-op, torch, OpenMP) and each child's are printed; the load
average before each round is printed and a round above one per core flagged BUSY (also in
<work>/result.json). Every figure is the median over the rounds with its min-max; ratios
(vs same-work, bf16/fp32) are the median of the per-round ratios, both sides from one round.
bf16/fp32 is our mixed_bfloat16 tokens/s over our default float32 step. `--curve-steps 200`
then trains BERT-small 200 steps in float32 and in mixed_bfloat16 from the same weights on the
same learnable synthetic batches (each id follows its predecessor by a fixed random map 3 times
in 4) and prints both loss curves, means over 20 steps, and their largest difference (tolerance
0.05 nats).
Also printed: the ceiling, the tokens/s of every model FLOP at the float32 matmul peak (MFU 100%),
and its ratio to transformers' figure: no float32 build of the same model beats it here.
The last line reads `bench-train: vs-transformers <x> mfu <y>`: x = the median of our float32
tokens/s over the same-work transformers peer's on BERT-small (the last model when small is not
run), y = our median float32 MFU there, in percent. The CPU's model and its avx2/avx512/bf16/AMX
flags are printed first; bf16/fp32 is `n/a` on a CPU without bfloat16 units. `--quick`:
BERT-tiny, 2 steps, batch 4, 2 rounds, no bfloat16 or torch.compile (try it).
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from bench import machine, protocol  # noqa: E402

import pipeline  # noqa: E402,F401  (before TensorFlow loads: its oneDNN switch, as training's)

VOCAB, SEQ, PREDICTIONS, BATCH = 30522, 128, 20, 32
VERSIONS = ("tensorflow", "keras", "keras-hub", "torch", "transformers")
QUICK = {"models": "tiny", "steps": 2, "warmup": 1, "batch": 4, "repeat": 2,
         "peak_seconds": 0.2, "bf16": False, "compile": False}


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
    parser.add_argument("--peak-seconds", type=float, default=2.0,
                        help="seconds of the matmul peak in each round (0: none, MFU n/a)")
    parser.add_argument("--rows", default="",
                        help="only these contenders, comma-separated (ours, ours_keras, "
                             "transformers_stock, transformers_same, "
                             "transformers_same_compiled, ours_bf16); default: all that apply")
    parser.add_argument("--curve-steps", type=int, default=0,
                        help="also train BERT-small this many steps in float32 and in "
                             "mixed_bfloat16 on the same learnable synthetic batches and "
                             "compare the loss curves (200: ~15 min on 2 cores)")
    parser.add_argument("--no-compile", dest="compile", action="store_false",
                        help="skip the torch.compile variant of the same-work transformers peer")
    parser.add_argument("--work", default=str(ROOT / "runs" / "bench-train"),
                        help="where result.json goes")
    protocol.add_arguments(parser)
    machine.add_quick(parser, QUICK)
    protocol.add_contender_flags(parser, argparse.SUPPRESS, "--contender", "--preset")
    return parser


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


# (row key, what runs): the peak matmuls, then per model ours and the peers, in this order in
# every round; each is one fresh process (contender_main).
PEAKS = (("peak_float32", "float32"), ("peak_bfloat16", "bfloat16"))
ROWS = (("ours float32", "ours", "float32"),
        ("ours float32, fused kernels off", "ours_keras", "float32"),
        ("transformers same work", "transformers_same", "float32"),
        ("transformers same work, compiled", "transformers_same_compiled", "float32"),
        ("transformers stock (more work)", "transformers_stock", "float32"),
        ("ours mixed_bfloat16", "ours_bf16", "bfloat16"))
SAME_WORK = ("transformers_same", "transformers_same_compiled")


def contender_keys(args, missing: str) -> list[str]:
    keys = ["ours"]
    if args.jit == "auto":  # the step before models/fused.py: Keras' ops, XLA on a CPU
        keys.append("ours_keras")
    if not missing:
        keys += [key for key, variant in TRANSFORMERS_VARIANTS
                 if variant != "same_work_compiled" or args.compile]
    if args.bf16:
        keys.append("ours_bf16")
    return keys


def contender_main(args) -> int:
    """(child) One contender, alone in this process, its pools pinned (bench/protocol.py); its
    figures as the last line of stdout (RESULT {json})."""
    import json

    data = synthetic(args.batch)
    key = args.contender
    if key.startswith("peak_") or not key.startswith("transformers"):
        import tensorflow as tf

        pools = {"tensorflow": protocol.pin_tensorflow(tf)}
    if key.startswith("peak_"):
        from pipeline.training.mfu import measure_peak_flops

        dtype = dict(PEAKS)[key]
        found = {"flops_per_second": measure_peak_flops(args.peak_seconds, getattr(tf, dtype))}
    elif key.startswith("transformers"):
        import torch

        pools = {"torch": protocol.pin_torch(torch)}
        variant = dict(TRANSFORMERS_VARIANTS)[key]
        found = bench_transformers(args.preset, data, args.steps, args.warmup, variant)
    else:
        overrides = ["train.fused_kernels=false"] if key == "ours_keras" else []
        found = bench_ours(args.preset, data, args.steps, args.warmup,
                           precision="mixed_bfloat16" if key == "ours_bf16" else "float32",
                           jit=args.jit, overrides=overrides)
        found["step_seconds"] = [float(x) for x in found["step_seconds"]]
    print("RESULT " + json.dumps({**found, "pools": pools}), flush=True)
    return 0


def run_contender(args, preset: str, key: str) -> dict:
    """One contender in a fresh process with the pinned threads; its figures, or {"error"}."""
    command = [sys.executable, str(Path(__file__).resolve()), "--role", "contender",
               "--contender", key, "--preset", preset, "--steps", str(args.steps),
               "--warmup", str(args.warmup), "--batch", str(args.batch), "--jit", args.jit,
               "--peak-seconds", str(args.peak_seconds)]
    return protocol.run_contender(command, args.threads, PYTHONPATH=str(ROOT),
                                  TF_CPP_MIN_LOG_LEVEL="2")


def main(argv=None) -> dict:
    import json

    from models import presets
    from models.flops import training_flops_per_token

    parser = build_parser()
    args = machine.apply_quick(parser.parse_args(argv), QUICK, argv)
    protocol.check_arguments(parser, args)
    if args.role:
        return contender_main(args)
    unknown = [p for p in args.models.split(",") if p not in presets.PRESETS]
    if unknown or min(args.steps, args.warmup, args.batch) < 1 or args.peak_seconds < 0:
        parser.error(f"--models: presets of models/presets.py ({', '.join(presets.PRESETS)}), "
                     f"got {args.models}; --steps, --warmup and --batch must be >= 1, "
                     f"--peak-seconds >= 0")
    rows = [key for _, key, _ in ROWS]
    if args.rows and not set(args.rows.split(",")) <= set(rows):
        parser.error(f"--rows: comma-separated, of {', '.join(rows)}; got {args.rows!r}")
    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    model, flags = machine.cpu_facts(machine.CPU_FLAGS + ("amx_tile",))
    bf16_units = machine.has_bf16_units()
    print(f"bench-train: CPU {model}; flags: " + machine.flags_text(flags, ", "), flush=True)
    missing = transformers_missing() if args.transformers else "skipped (--no-transformers)"
    if missing:
        print(f"bench-train: transformers: {missing}; reporting ours alone", flush=True)
    print(f"bench-train: {machine.cores()} CPUs, " + "  ".join(
        f"{k} {v}" for k, v in machine.versions(VERSIONS).items())
        + f"; seq {SEQ}, batch {args.batch}, {PREDICTIONS} masked positions, vocab {VOCAB}, "
        f"{args.steps} timed steps after {args.warmup}", flush=True)
    print(f"bench-train: protocol: {args.repeat} round(s), in each the matmul peak, then per "
          f"model every contender once, each a fresh process, in the same order; "
          f"{protocol.threads_text(args.threads)}", flush=True)
    keys = [key for key in contender_keys(args, missing)
            if not args.rows or key in args.rows.split(",")]
    peak_keys = [k for k, dtype in PEAKS if (dtype == "float32" or args.bf16)
                 and args.peak_seconds > 0]
    contenders = [(key, functools.partial(lambda key, index: run_contender(args, "tiny", key),
                                          key)) for key in peak_keys]
    for preset in args.models.split(","):
        contenders += [(f"{preset} {key}", functools.partial(
            lambda preset, key, index: run_contender(args, preset, key), preset, key))
            for key in keys]

    def shown(name: str, run):
        def run_and_print(index: int) -> dict:
            found = run(index)
            if "error" in found:
                print(f"bench-train: {name}: n/a ({found['error']})", flush=True)
            elif "flops_per_second" in found:
                print(f"bench-train: {name}: {found['flops_per_second'] / 1e9:,.0f} GFLOP/s",
                      flush=True)
            else:
                preset, key = name.split(" ", 1)
                report(preset, dict((k, n) for n, k, _ in ROWS)[key], found,
                       flops[preset], note=found["note"])
            return found
        return run_and_print

    flops = {}
    for preset in args.models.split(","):
        arch = presets.PRESETS[preset]
        flops[preset] = training_flops_per_token(
            num_layers=arch["num_layers"], hidden_dim=arch["hidden_dim"],
            intermediate_dim=arch["intermediate_dim"], vocabulary_size=VOCAB, seq_length=SEQ,
            num_predictions=PREDICTIONS)
    rounds = protocol.run_rounds([(name, shown(name, run)) for name, run in contenders],
                                 args.repeat, log=lambda line: print(f"bench-train: {line}",
                                                                     flush=True))
    summary = summarize(args, rounds, flops, peak_keys, keys)
    pools = {}
    for r in rounds:
        for found in r["results"].values():
            pools.update(found.get("pools", {}))
    print("bench-train: threads each side reported: " + "; ".join(
        f"{lib} {protocol.pools_text(p)}" for lib, p in sorted(pools.items())), flush=True)
    note = protocol.busy_note(rounds)
    if note:
        print(f"bench-train: {note}", flush=True)
    if not bf16_units and args.bf16:
        print("bench-train: bf16/fp32 n/a: this CPU has no bfloat16 units (no avx512_bf16 or "
              "amx_bf16 flag); bfloat16 is emulated in float32 here", flush=True)
    if args.curve_steps:
        curve_check(args)
    results, peaks = summary["results"], summary["peaks"]
    head = results.get("small") or results[list(results)[-1]]
    vs = (f"{head['vs_transformers']['median']:.2f}" if head.get("vs_transformers") else "n/a")
    mfu = head.get("ours", {}).get("mfu")
    line = (f"bench-train: vs-transformers {vs} mfu "
            f"{'n/a' if mfu is None else format(100 * mfu, '.1f')}")
    (work / "result.json").write_text(json.dumps({
        "machine": machine.facts(VERSIONS), "settings": {k: str(v) for k, v in vars(args).items()},
        "protocol": protocol.record(rounds, args.threads), "pools": pools, "peaks": peaks,
        "results": results, "line": line}, indent=2, default=str))
    print(line, flush=True)
    return {"peaks": peaks, "results": results, "rounds": rounds}


def summarize(args, rounds: list, flops: dict, peak_keys: list, keys: list) -> dict:
    """The medians (min-max) over the rounds, printed as the table: tokens/s per contender,
    MFU against the best matmul peak of the rounds, ours over the same-work peer and bf16 over
    float32 as the median of the per-round ratios (both sides of a ratio from one round)."""
    def values(name: str, pick) -> list:
        return [pick(r["results"][name]) for r in rounds if "error" not in r["results"][name]]

    peaks = {dict(PEAKS)[k]: max(values(k, lambda f: f["flops_per_second"]), default=0.0)
             for k in peak_keys}
    print("bench-train: matmul peak (the best of the rounds) " + (", ".join(
        f"{k} {v / 1e9:,.0f} GFLOP/s" for k, v in peaks.items()) or "not measured "
        "(--peak-seconds 0): MFU n/a"), flush=True)
    print(f"{'model':<7}{'contender':<34}{'tokens/s median (min-max)':>28}{'s/step':>8}"
          f"{'model GFLOP/s':>15}{'MFU':>7}{'vs same-work':>14}{'bf16/fp32':>11}")
    results = {}
    for preset in args.models.split(","):
        row = {"flops_per_token": flops[preset]}
        for key in keys:
            tps = values(f"{preset} {key}", lambda f: f["tokens_per_second"])
            if tps:
                row[key] = {"tokens_per_second": protocol.spread(tps),
                            "seconds_per_step": protocol.spread(values(
                                f"{preset} {key}", lambda f: f["seconds_per_step"]))}

        def per_round(pick) -> list:
            out = []
            for r in rounds:
                got = pick({k: r["results"][f"{preset} {k}"] for k in keys})
                if got is not None:
                    out.append(got)
            return out

        def same_work(found: dict):
            rates = [found[k]["tokens_per_second"] for k in SAME_WORK
                     if k in found and "error" not in found[k]]
            return max(rates) if rates else None  # the faster variant of the round

        def ratio(found: dict, key: str, other) -> float | None:
            theirs = other(found)
            if key not in found or "error" in found[key] or not theirs:
                return None
            return found[key]["tokens_per_second"] / theirs

        own = lambda key: lambda found: (found[key]["tokens_per_second"]  # noqa: E731
                                         if key in found and "error" not in found[key] else None)
        vs = {key: per_round(lambda found, key=key: ratio(found, key, same_work))
              for key in ("ours", "ours_keras", "ours_bf16")}
        bf16 = per_round(lambda found: ratio(found, "ours_bf16", own("ours")))
        if vs["ours"]:
            row["vs_transformers"] = protocol.spread(vs["ours"])
        if bf16 and machine.has_bf16_units():
            row["bf16_over_fp32"] = protocol.spread(bf16)
        for name, key, dtype in ROWS:
            if key not in row:
                continue
            tps = row[key]["tokens_per_second"]
            rate = tps["median"] * flops[preset]  # our model's FLOPs (the stock peer does more)
            row[key]["mfu"] = rate / peaks[dtype] if peaks.get(dtype) else None
            mfu = "n/a" if row[key]["mfu"] is None else f"{row[key]['mfu']:.1%}"
            spread = protocol.spread_text(tps["values"], ",.0f")
            against = (protocol.spread_text(vs[key], ".2f") + "x" if vs.get(key) else "-")
            b16 = ((protocol.spread_text(bf16, ".2f") + "x" if machine.has_bf16_units()
                    else "n/a") if key == "ours_bf16" and bf16 else "-")
            print(f"{preset:<7}{name:<34}{spread:>28}{row[key]['seconds_per_step']['median']:>8.2f}"
                  f"{rate / 1e9:>15,.1f}{mfu:>7}{against:>14}{b16:>11}")
        # What no float32 implementation of the same model can beat on this machine: every
        # model FLOP at the matmul peak (MFU 100%), and that rate over the transformers figure.
        if peaks.get("float32"):
            ceiling = peaks["float32"] / flops[preset]
            theirs = per_round(same_work)
            print(f"bench-train: {preset} ceiling (every model FLOP at the float32 matmul "
                  f"peak): {ceiling:,.0f} tokens/s" + (
                      f" = {ceiling / protocol.spread(theirs)['median']:.2f}x transformers "
                      f"(its median)" if theirs else ""), flush=True)
        results[preset] = row
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

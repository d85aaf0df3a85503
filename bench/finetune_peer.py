"""The transformers peer of `make bench-finetune` (bench/bench_finetune.py): our recipe as
BertForSequenceClassification + Trainer on the race's TSV files, run in its own process
(`--role peer`), and the checks that both sides start from the same weights and token ids (the
vocab, every row's token ids, every encoder weight and the pooled [CLS] output, compared in the
`--role init` process: bench/finetune_start.py).

transformers, torch and our models/ are imported inside the functions: the parent process of
the race never loads them.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from bench import protocol
from bench.finetune_data import read_tsv

# Our activation names → the transformers `hidden_act` computing the same function.
PEER_ACT = {"gelu_approximate": "gelu_pytorch_tanh", "gelu": "gelu", "relu": "relu"}


# ---------------------------------------------------------------------------
# Starting from the same model: the tokenizer and the pooled output compared
# ---------------------------------------------------------------------------
def peer_tokenizer(hf_dir: Path, lowercase: bool):
    from transformers import BertTokenizerFast

    return BertTokenizerFast.from_pretrained(str(hf_dir), do_lower_case=lowercase,
                                             strip_accents=lowercase)


def compare_tokenizers(vocab, lowercase, hf_dir, settings) -> dict:
    """How many rows (train 1x, validation, test) get the same token ids from both sides, and
    the first row that does not (its index in that order; -1: none)."""
    from models.preprocessor import TextPreprocessor

    texts = [t for name in ("train", "validation", "test")
             for t, _ in read_tsv(Path(settings["data"]) / f"{name}.tsv")]
    ours = TextPreprocessor(vocab, lowercase, settings["seq_len"]).features(texts)["token_ids"]
    theirs = peer_tokenizer(hf_dir, lowercase)(texts, max_length=settings["seq_len"],
                                               padding="max_length", truncation=True,
                                               return_tensors="np")["input_ids"]
    same = (ours == theirs).all(axis=1)
    return {"rows_same_ids": int(same.sum()), "rows": len(texts),
            "first_row_differing": int((~same).argmax()) if not same.all() else -1}


def compare_vocab(vocab, lowercase, hf_dir) -> dict:
    """Our vocab (token → its line number) against the peer tokenizer's token → id map: how
    many tokens differ and the first of them."""
    theirs = peer_tokenizer(hf_dir, lowercase).get_vocab()
    ours = {token: i for i, token in enumerate(vocab)}
    differ = sorted({*(t for t, i in ours.items() if theirs.get(t) != i),
                     *(t for t, i in theirs.items() if ours.get(t) != i)},
                    key=lambda t: (min(ours.get(t, len(ours)), theirs.get(t, len(theirs))), t))
    first = ""
    if differ:
        t = differ[0]
        first = f"{t!r}: id {ours.get(t, 'none')} in ours, {theirs.get(t, 'none')} in theirs"
    return {"vocab_ours": len(ours), "vocab_theirs": len(theirs), "vocab_differ": len(differ),
            "first_vocab_difference": first}


def compare_weights(keras_file, settings: dict) -> dict:
    """Every encoder and pooler weight of our .keras file (under transformers' names,
    models.convert's export layout) against the peer's model as its Trainer run loads it
    (`load_peer`): the largest |difference| and which weights one side lacks."""
    import numpy as np

    import models
    from models.convert import huggingface

    ours = {name[len("bert."):]: value for name, value in huggingface.to_state_dict(
        models.load_keras(keras_file, compile=False)).items() if name.startswith("bert.")}
    theirs = {name: p.detach().numpy() for name, p in
              load_peer(settings, len(settings["labels"])).bert.named_parameters()}
    gaps = {n: float(np.nan_to_num(np.abs(ours[n] - theirs[n]), nan=np.inf).max())
            if ours[n].shape == theirs[n].shape
            else float("inf") for n in sorted(set(ours) & set(theirs))}
    worst = max(gaps, key=gaps.get, default="")
    return {"weights": len(gaps), "weights_max_abs_diff": gaps.get(worst, float("inf")),
            "worst_weight": worst,
            "only_ours": sorted(set(ours) - set(theirs)),
            "only_theirs": sorted(set(theirs) - set(ours)),
            "peer_dtypes": sorted({str(v.dtype) for v in theirs.values()})}


def compare_pooled(keras_file, hf_dir, texts, seq_len, vocab, lowercase) -> float:
    """Max |ours - theirs| of the pooled [CLS] output (dropout off) on `texts`."""
    import numpy as np
    import torch
    from transformers import BertModel

    import models
    from models.preprocessor import TextPreprocessor

    backbone = models.load_keras(keras_file, compile=False).backbone  # as our stage loads it
    x = TextPreprocessor(vocab, lowercase, seq_len).features(texts)
    ours = np.asarray(backbone(x, training=False)["pooled_output"])
    peer = BertModel.from_pretrained(str(hf_dir)).eval()
    with torch.no_grad():
        theirs = peer(input_ids=torch.tensor(x["token_ids"], dtype=torch.long),
                      token_type_ids=torch.tensor(x["segment_ids"], dtype=torch.long),
                      attention_mask=torch.tensor(x["padding_mask"], dtype=torch.long)
                      ).pooler_output.numpy()
    return float(np.abs(ours - theirs).max())


# ---------------------------------------------------------------------------
# The Trainer run (the `--role peer` child process of bench/bench_finetune.py)
# ---------------------------------------------------------------------------
def peer_main(settings: dict) -> None:
    """(child) BertForSequenceClassification + Trainer on the same files; writes peer.json."""
    started = time.perf_counter()
    import numpy as np
    import torch
    import transformers
    from sklearn.metrics import accuracy_score, f1_score

    times = {"imports": time.perf_counter() - started}
    pools = protocol.pin_torch(torch)  # as the race's --threads (BENCH_THREADS) says
    transformers.set_seed(settings["seed"])
    labels, data = settings["labels"], Path(settings["data"])
    tokenizer = peer_tokenizer(Path(settings["hf_dir"]), settings["lowercase"])
    mark = time.perf_counter()
    splits = {name: encode(read_tsv(data / f"{name}.tsv"), tokenizer, labels, settings["seq_len"],
                           torch) for name in ("train", "validation", "test")}
    times["tokenize"] = time.perf_counter() - mark
    mark = time.perf_counter()
    model = load_peer(settings, len(labels))
    times["load"] = time.perf_counter() - mark

    def metrics(prediction):
        predicted = np.argmax(prediction.predictions, axis=-1)
        return {"accuracy": accuracy_score(prediction.label_ids, predicted),
                "macro_f1": f1_score(prediction.label_ids, predicted, average="macro",
                                     labels=list(range(len(labels))), zero_division=0)}

    clock = clock_callback(transformers)
    trainer = transformers.Trainer(model=model, args=training_arguments(settings, transformers),
                                   train_dataset=splits["train"], eval_dataset=splits["validation"],
                                   compute_metrics=metrics, callbacks=[clock])
    train_call = time.perf_counter()
    trainer.train()
    times["train"] = time.perf_counter() - train_call
    clock.restore_best(model)
    mark = time.perf_counter()
    output = trainer.predict(splits["test"])
    times["test"] = time.perf_counter() - mark
    predicted = np.argmax(output.predictions, axis=-1)
    gold = output.label_ids
    (Path(settings["peer_dir"]) / "peer.json").write_text(json.dumps({
        "times": times, "train_call": train_call, "step_ends": clock.step_ends,
        "evaluations": clock.evaluations,
        "threads": torch.get_num_threads(), "pools": pools,
        "macro_f1": float(f1_score(gold, predicted, average="macro",
                                   labels=list(range(len(labels))), zero_division=0)),
        "accuracy": float(accuracy_score(gold, predicted)),
        "predicted": [labels[i] for i in predicted]}, indent=2))


def load_peer(settings: dict, num_labels: int):
    """BertForSequenceClassification from the peer's directory in float32, the head's dropout
    as ours (finetune.dropout); the same call for the Trainer run and the weight check."""
    import torch
    import transformers

    return transformers.BertForSequenceClassification.from_pretrained(
        settings["hf_dir"], num_labels=num_labels, classifier_dropout=settings["dropout"],
        dtype=torch.float32)


def encode(rows: list, tokenizer, labels: list, seq_len: int, torch):
    """Token ids padded to seq_len (as ours), labels by their index in the sorted label set."""
    ids = tokenizer([text for text, _ in rows], max_length=seq_len, padding="max_length",
                    truncation=True, return_tensors="pt")
    index = {label: i for i, label in enumerate(labels)}
    target = torch.tensor([index[label] for _, label in rows], dtype=torch.long)
    return [{"input_ids": ids["input_ids"][i], "token_type_ids": ids["token_type_ids"][i],
             "attention_mask": ids["attention_mask"][i], "labels": target[i]}
            for i in range(len(rows))]


def training_arguments(settings: dict, transformers):
    """Our recipe in Trainer's terms."""
    return transformers.TrainingArguments(
        output_dir=settings["peer_dir"], use_cpu=True, seed=settings["seed"],
        per_device_train_batch_size=settings["batch_size"],
        per_device_eval_batch_size=settings["batch_size"], max_steps=settings["steps"],
        learning_rate=settings["learning_rate"], lr_scheduler_type="linear",
        warmup_steps=round(settings["warmup_fraction"] * settings["steps"]),
        weight_decay=settings["weight_decay"], adam_beta1=0.9, adam_beta2=0.999,
        adam_epsilon=1e-6, max_grad_norm=1.0, bf16=False, fp16=False,  # float32, as ours
        eval_strategy="epoch", save_strategy="no",
        logging_strategy="no", report_to="none", disable_tqdm=True, dataloader_num_workers=0)


def clock_callback(transformers):
    """A TrainerCallback: step end times, each epoch-end evaluation's seconds and metrics, and
    (as our stage) the best epoch's weights by validation accuracy, kept in memory and put back
    at the end (`restore_best`)."""

    class Clock(transformers.TrainerCallback):
        def __init__(self):
            self.step_ends, self.evaluations, self.epoch_end = [], [], None
            self.best, self.best_state = -1.0, None

        def on_step_end(self, args, state, control, **kwargs):
            self.step_ends.append(time.perf_counter())

        def on_epoch_end(self, args, state, control, **kwargs):
            self.epoch_end = time.perf_counter()  # the epoch-end evaluation follows

        def on_evaluate(self, args, state, control, metrics=None, model=None, **kwargs):
            self.evaluations.append({"seconds": time.perf_counter() - self.epoch_end,
                                     "step": state.global_step, **(metrics or {})})
            value = (metrics or {}).get("eval_accuracy", -1.0)
            if value > self.best:
                self.best = value
                self.best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}

        def restore_best(self, model):
            if self.best_state is not None and len(self.evaluations) > 1:
                model.load_state_dict(self.best_state)

    return Clock()

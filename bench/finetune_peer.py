"""The transformers peer of `make bench-finetune` (bench/bench_finetune.py): our recipe as
BertForSequenceClassification + Trainer on the race's TSV files, run in its own process
(`--role peer`), and the checks that it starts from our weights and token ids (the pooled [CLS]
output and the tokenizer, compared in the `--role init` process).

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
    """How many rows (train 1x, validation, test) get the same token ids from both sides."""
    from models.preprocessor import TextPreprocessor

    texts = [t for name in ("train", "validation", "test")
             for t, _ in read_tsv(Path(settings["data"]) / f"{name}.tsv")]
    ours = TextPreprocessor(vocab, lowercase, settings["seq_len"]).features(texts)["token_ids"]
    theirs = peer_tokenizer(hf_dir, lowercase)(texts, max_length=settings["seq_len"],
                                               padding="max_length", truncation=True,
                                               return_tensors="np")["input_ids"]
    return {"rows_same_ids": int((ours == theirs).all(axis=1).sum()), "rows": len(texts)}


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
    model = transformers.BertForSequenceClassification.from_pretrained(
        settings["hf_dir"], num_labels=len(labels))
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
        adam_epsilon=1e-6, max_grad_norm=1.0, eval_strategy="epoch", save_strategy="no",
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

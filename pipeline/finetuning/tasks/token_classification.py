"""Token classification: a tag per word (POS, NER chunks), a softmax head on every position
(models/heads.py BertTokenClassifier); the tag is predicted on a word's first piece.
Chunk tag sets (B-/I-) are scored by CoNLL span F1, others by token accuracy.
"""

from __future__ import annotations

import numpy as np

from pipeline.finetuning.tasks.base import (
    INPUTS,
    FinetuneTask,
    Split,
    predict_batch,
    register,
)


def fallback_tag(labels) -> str:
    """The tag of words cut by truncation: "O" if the tag set has it."""
    return "O" if "O" in labels else labels[0]


@register
class TokenClassification(FinetuneTask):
    name = "token_classification"
    datasets = ("brown_pos", "conll")
    metric = "f1"
    label_set = True
    pooled = False
    multitask = True
    targets = {"logits": "labels"}
    weights = {"logits": "weights"}

    def read_file(self, path, fc) -> list:
        from pipeline.finetuning.readers import read_conll

        return read_conll(path, fc.conll_word_column, fc.conll_label_column)

    def make_split(self, examples, pre, labels, pair) -> Split:
        from pipeline.finetuning import features

        f = features.token_features(examples, pre, labels)
        return Split(examples, {k: f[k] for k in INPUTS}, {"logits": f["labels"]},
                     {"logits": f["weights"]}, f)

    def row_meta(self, split, start) -> dict:
        """"word_positions": each word's first piece, -1 after the last word."""
        positions = np.full(split.x["token_ids"].shape, -1, np.int64)
        for i, pos in enumerate(split.meta["word_positions"]):
            positions[i, :len(pos)] = pos
        return {"word_positions": positions}

    def notes(self, sample) -> list[str]:
        cut = sample().meta["truncated_words"]
        return [f"{cut} training words beyond max_seq_length were cut"] if cut else []

    def build_model(self, backbone, num_labels):
        from models import heads

        self.freeze(backbone)
        return heads.BertTokenClassifier(backbone, num_labels, dropout=self.fc.dropout)

    def losses(self) -> dict:
        import keras

        # Only first word pieces carry a label (weight 1): the mean is over those.
        ce = keras.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                        reduction="mean_with_sample_weight")
        return {"loss": {"logits": ce},
                "weighted_metrics": {"logits": [keras.metrics.SparseCategoricalAccuracy(
                    "accuracy")]}}

    @staticmethod
    def score(gold: list, tags: list, labels: list) -> dict:
        from pipeline.finetuning import metrics

        if metrics.is_chunk_tagset(labels):
            return metrics.conll_f1(gold, tags)
        # POS-style tags: every token is its own "chunk"; F1 = token accuracy
        accuracy = metrics.token_accuracy(gold, tags)
        return {"token_accuracy": accuracy, "f1": accuracy}

    def evaluate(self, model, split, data, encoder=None):
        """Per word the tag of its first piece, batch by batch; words cut by truncation get
        the fallback tag."""
        fallback, labels, examples = fallback_tag(data.labels), data.labels, split.examples
        tags: dict[int, list] = {}
        for rows, x in self.batches(split, 2 * self.fc.batch_size):
            best = predict_batch(model, x)["logits"].argmax(-1)
            for r, ex in enumerate(np.asarray(rows["example_index"]).reshape(-1).tolist()):
                positions = rows["word_positions"][r]
                found = [labels[best[r, p]] for p in positions[positions >= 0]]
                tags[ex] = found + [fallback] * (len(examples[ex].words) - len(found))
        tags = [tags[i] for i in range(len(examples))]
        return self.score([e.tags for e in examples], tags, data.labels), {"tags": tags}

    def baselines(self, data, seed):
        """The commonest tag everywhere; every word its most frequent training tag (else the
        commonest); a linear-chain CRF on word-shape and context features, its settings
        tuned on the validation split (pipeline/finetuning/baselines.py)."""
        import time
        from collections import Counter

        from pipeline.finetuning import baselines

        started = time.time()
        overall = Counter(t for e in data.train for t in e.tags).most_common(1)[0][0]
        per_word: dict = {}
        for e in data.train:
            for w, t in zip(e.words, e.tags):
                per_word.setdefault(w.lower(), Counter())[t] += 1
        best = {w: c.most_common(1)[0][0] for w, c in per_word.items()}
        gold = [e.tags for e in data.test]
        out = {"majority": self.score(gold, [[overall] * len(e.words) for e in data.test],
                                      data.labels),
               "most_frequent_tag": self.score(
                   gold, [[best.get(w.lower(), overall) for w in e.words] for e in data.test],
                   data.labels)}
        chosen, tags, value = baselines.crf_tagger(
            data, lambda g, p: self.score(g, p, data.labels)[data.metric], seed, self.fc)
        out["crf"] = baselines.row(self.score(gold, tags, data.labels), chosen, value,
                                   data.metric)
        baselines.log.info(f"finetune: baselines in {time.time() - started:.1f} s")
        return out

    def prediction_row(self, example, prediction, i, data) -> dict:
        return {"words": example.words, "gold": example.tags, "predicted": prediction["tags"][i]}

    # ---- outputs ---------------------------------------------------------------------
    def serving_module(self, model, pre, labels, pair, info):
        from pipeline.serving import word_serving

        return word_serving.build_token_module(model, pre, labels)

    def check_export(self, folder, model, pre, data, info) -> dict:
        """Max |exported − in-memory| score and the number of words whose tag differs (or
        texts whose word count differs), raw strings into the SavedModel vs. the Python
        tokenization + the in-memory model, on the first test examples."""
        from pipeline.finetuning import features
        from pipeline.serving import export

        texts = [" ".join(e.words) for e in data.test[:32]]
        exported = export.run_token_model(export.load_saved_model(folder), texts)
        memory = features.python_tag(model, pre, texts, info["labels"])
        pairs = [(a, b) for x, y in zip(exported, memory)
                 for a, b in zip(zip(x["labels"], x["scores"]), zip(y["labels"], y["scores"]))]
        mismatches = sum(a[0] != b[0] for a, b in pairs) + \
            sum(len(x["labels"]) != len(y["labels"]) for x, y in zip(exported, memory))
        diff = max([abs(a[1] - b[1]) for a, b in pairs], default=0.0)
        return {"export_max_abs_diff": float(diff), "export_mismatches": int(mismatches)}

    def predict_rows(self, predictor, texts, pairs) -> list[dict]:
        """Per text: its whitespace-separated words with a tag and its probability each (the
        SavedModel; a folder without one: the .keras model, Python tokenization)."""
        from pipeline.finetuning import features
        from pipeline.serving.export import run_token_model

        if predictor.paths.saved_model.is_dir():
            out = run_token_model(predictor.serve, texts)
        else:
            model, pre = predictor.keras_parts()
            out = features.python_tag(model, pre, texts, predictor.info["labels"])
        return [{"text": t, "tags": [[w, g] for w, g in zip(o["words"], o["labels"])],
                 "scores": [round(x, 6) for x in o["scores"]]} for t, o in zip(texts, out)]

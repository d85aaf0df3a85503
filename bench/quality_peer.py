"""The transformers peer of `make bench-quality` (bench/bench_quality.py): run_mlm-style data
from our training documents (MLM blocks, or NSP sentence pairs), the two recipes (same and
documented), and transformers' Trainer run with the held-out probes at wall-clock points of
its training seconds (BudgetWatch)."""

from __future__ import annotations

import dataclasses
import os
import random
import time
from pathlib import Path

from bench import protocol

CALIBRATION_STEPS = 16  # untimed peer steps to measure seconds per step (the first 4 ignored)

# (b) "documented": BERT's pretraining recipe, as the BERT paper gives it (Devlin et al. 2019,
# "BERT: Pre-training of Deep Bidirectional Transformers...", appendix A.2 "Pre-training
# Procedure"): Adam, lr 1e-4, β1 = 0.9, β2 = 0.999, L2 weight decay 0.01, learning-rate warmup
# over the first 10,000 of 1,000,000 steps (1%) then linear decay, dropout 0.1 on all layers.
# The paper's batch (256) is replaced by 32 here; what it does not state is left at the
# transformers defaults a user gets (TrainingArguments: adam_epsilon 1e-8, max_grad_norm 1.0).
DOCUMENTED_RECIPE = dict(learning_rate=1e-4, beta_1=0.9, beta_2=0.999, weight_decay=0.01,
                         warmup_fraction=0.01, batch_size=32, dropout=0.1, epsilon=1e-8,
                         clipnorm=1.0, initializer_range=0.02)


def read_documents(folder: Path) -> list[list[str]]:
    """Google-format text: one sentence per line, a blank line between documents."""
    documents, current = [], []
    for path in sorted(folder.glob("*.txt")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                current.append(line.strip())
            elif current:
                documents.append(current)
                current = []
        if current:
            documents.append(current)
            current = []
    return documents


def tokenize_documents(tokenizer, documents: list[list[str]]) -> list[list[list[int]]]:
    """Each document as a list of sentences of token ids (no special tokens)."""
    flat = [sentence for document in documents for sentence in document]
    ids = tokenizer(flat, add_special_tokens=False)["input_ids"]
    out, start = [], 0
    for document in documents:
        out.append(ids[start:start + len(document)])
        start += len(document)
    return out


def mlm_blocks(tokenizer, documents, max_seq_length: int) -> list[dict]:
    """run_mlm's "group_texts": every training token in one stream (a [SEP] after each
    document), cut into blocks of max_seq_length - 2 (the remainder dropped), each wrapped in
    [CLS] ... [SEP]; one segment."""
    stream_ids = []
    for document in documents:
        for sentence in document:
            stream_ids.extend(sentence)
        stream_ids.append(tokenizer.sep_token_id)
    size = max_seq_length - 2
    return [{"input_ids": [tokenizer.cls_token_id] + stream_ids[i:i + size]
             + [tokenizer.sep_token_id],
             "token_type_ids": [0] * max_seq_length, "attention_mask": [1] * max_seq_length}
            for i in range(0, len(stream_ids) - size + 1, size)]


def nsp_pairs(tokenizer, documents, max_seq_length: int, seed: int) -> list[dict]:
    """Sentence pairs for BertForPreTraining, the way BERT makes them: each document cut into
    chunks of whole sentences of about max_seq_length - 3 tokens, a chunk split at a random
    sentence into A and B; half the time B is replaced by sentences of another document
    (next_sentence_label 1); the pair trimmed to fit, from the longer side."""
    rng = random.Random(seed)
    target = max_seq_length - 3
    pairs = []
    for index, document in enumerate(documents):
        chunk, length = [], 0
        for position, sentence in enumerate(document):
            chunk.append(sentence)
            length += len(sentence)
            if length < target and position < len(document) - 1:
                continue
            cut = rng.randint(1, max(1, len(chunk) - 1))
            first = [t for s in chunk[:cut] for t in s]
            if len(chunk) < 2 or rng.random() < 0.5:  # B from another document
                other = rng.randrange(len(documents) - 1)
                other = documents[other + (other >= index)]
                start = rng.randrange(len(other))
                second = [t for s in other[start:] for t in s][:target]
                label = 1
            else:  # B = the rest of the chunk
                second = [t for s in chunk[cut:] for t in s]
                label = 0
            while len(first) + len(second) > target:
                longer = first if len(first) > len(second) else second
                longer.pop(0 if rng.random() < 0.5 else -1)
            if first and second:
                ids = ([tokenizer.cls_token_id] + first + [tokenizer.sep_token_id] + second
                       + [tokenizer.sep_token_id])
                pairs.append({"input_ids": ids,
                              "token_type_ids": [0] * (len(first) + 2) + [1] * (len(second) + 1),
                              "attention_mask": [1] * len(ids), "next_sentence_label": label})
            chunk, length = [], 0
    return pairs


def peer_missing() -> str:
    """Why the peer cannot run here ("" if it can): transformers' Trainer needs torch,
    transformers and accelerate."""
    import importlib.util

    missing = [name for name in ("torch", "transformers", "accelerate")
               if importlib.util.find_spec(name) is None]
    if not missing:
        return ""
    return (f"{', '.join(missing)} not installed: the peer (transformers' Trainer) needs torch, "
            f"transformers and accelerate (requirements-test.txt, installed by `make setup`); "
            f"or run with --skip-peer")


def peer_tokenizer(transformers, vocab_file: Path):
    """`BertTokenizerFast` on our vocab.txt, uncased with accents stripped (as our vocab), and
    checked to give every token of vocab.txt its line number as id (ours).

    transformers 5 takes the vocabulary as `vocab` (a dict; its `BertTokenizerFast` is
    `BertTokenizer`) and silently ignores a `vocab_file` keyword: the tokenizer would have a
    five-token vocabulary and map every word to [UNK]. transformers 4 takes `vocab_file`.
    """
    import inspect

    tokens = [line.rstrip("\n") for line in open(vocab_file, encoding="utf-8")]
    cls = transformers.BertTokenizerFast
    if "vocab_file" in inspect.signature(cls.__init__).parameters:  # transformers 4
        tokenizer = cls(vocab_file=str(vocab_file), do_lower_case=True, strip_accents=True)
    else:
        tokenizer = cls(vocab={token: i for i, token in enumerate(tokens)}, do_lower_case=True,
                        strip_accents=True)
    ids = tokenizer.convert_tokens_to_ids(tokens)
    wrong = [(i, t, j) for i, (t, j) in enumerate(zip(tokens, ids)) if i != j]
    if len(tokenizer) != len(tokens) or wrong:
        raise SystemExit(f"bench-quality: BertTokenizerFast does not reproduce {vocab_file} "
                         f"({len(tokenizer)} tokens for {len(tokens)} lines; first mismatch "
                         f"{wrong[:1]})")
    return tokenizer


@dataclasses.dataclass
class PeerRecipe:
    name: str            # "same" | "documented"
    label: str
    learning_rate: float
    warmup_steps: int    # used when warmup_fraction is 0
    warmup_fraction: float
    batch_size: int
    weight_decay: float
    beta_1: float
    beta_2: float
    epsilon: float
    clipnorm: float
    dropout: float
    end_learning_rate: float = 0.0
    decay_power: float = 1.0
    initializer_range: float = 0.02  # BertConfig's, the spread of its normal init
    masked_lm_prob: float = 0.15     # the collator's mlm_probability (training masks)

    def warmup(self, steps: int) -> int:
        return round(self.warmup_fraction * steps) if self.warmup_fraction else self.warmup_steps


def peer_recipes(config, names) -> list[PeerRecipe]:
    from pipeline import config as config_lib

    tc = config.train
    recipes = {
        "same": PeerRecipe(
            "same", "(a) same recipe", tc.learning_rate, tc.warmup_steps, 0.0,
            tc.batch_size * tc.grad_accum_steps, tc.weight_decay, tc.beta_1, tc.beta_2,
            tc.epsilon, tc.clipnorm, config.model.dropout, tc.end_learning_rate,
            tc.decay_power, config.model.initializer_range,
            config_lib.training_masks(config)[0]),
        "documented": PeerRecipe(
            "documented", "(b) documented", DOCUMENTED_RECIPE["learning_rate"], 0,
            DOCUMENTED_RECIPE["warmup_fraction"], DOCUMENTED_RECIPE["batch_size"],
            DOCUMENTED_RECIPE["weight_decay"], DOCUMENTED_RECIPE["beta_1"],
            DOCUMENTED_RECIPE["beta_2"], DOCUMENTED_RECIPE["epsilon"],
            DOCUMENTED_RECIPE["clipnorm"], DOCUMENTED_RECIPE["dropout"],
            initializer_range=DOCUMENTED_RECIPE["initializer_range"]),
    }
    return [recipes[name] for name in names]


class Peer:
    """Builds, trains and evaluates the transformers contender."""

    def __init__(self, args, config, paths, heldout: dict, workdir: Path):
        import torch
        import transformers

        from pipeline import config as config_lib

        self.torch, self.transformers = torch, transformers
        self.args, self.config, self.workdir = args, config, workdir
        self.step_seconds = {}  # batch size -> measured seconds per step
        # The bench's pinned count (bench/protocol.py), else every core, as ours uses.
        if not os.environ.get(protocol.THREADS_VARIABLE):
            torch.set_num_threads(os.cpu_count() or 2)
        self.pools = protocol.pin_torch(torch)
        self.tokenizer = peer_tokenizer(transformers, paths.vocab_file)
        self.vocab_size = len(self.tokenizer)
        self.arch = config_lib.model_architecture(config)
        self.max_seq_length = config.data.max_seq_length

        started = time.perf_counter()
        documents = tokenize_documents(self.tokenizer,
                                       read_documents(paths.corpus_train_dir))
        if args.peer_model == "mlm":
            self.examples = mlm_blocks(self.tokenizer, documents, self.max_seq_length)
        else:
            self.examples = nsp_pairs(self.tokenizer, documents, self.max_seq_length, args.seed)
        self.tokens = sum(len(e["input_ids"]) for e in self.examples)
        self.data_seconds = time.perf_counter() - started

        # The held-out instances as tensors, as the records have them (already masked).
        self.heldout = {name: torch.as_tensor(heldout[name]) for name in
                        ("input_ids", "input_mask", "segment_ids", "masked_lm_positions",
                         "masked_lm_ids", "masked_lm_weights")}
        # An MLM-only peer never trains the token type 1 embedding: it reads every held-out
        # token as segment 0, as it was trained (the pretraining peer sees the segments).
        if args.peer_model == "mlm":
            self.heldout["segment_ids"] = torch.zeros_like(self.heldout["segment_ids"])

    def build_model(self, dropout: float, initializer_range: float = 0.02):
        self.torch.manual_seed(self.args.seed)
        activation = {"gelu_approximate": "gelu_new", "gelu": "gelu"}.get(
            self.config.model.activation, self.config.model.activation)
        bert_config = self.transformers.BertConfig(
            vocab_size=self.vocab_size, hidden_size=self.arch["hidden_dim"],
            num_hidden_layers=self.arch["num_layers"], num_attention_heads=self.arch["num_heads"],
            intermediate_size=self.arch["intermediate_dim"], hidden_act=activation,
            hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout,
            max_position_embeddings=self.config.model.max_sequence_length,
            type_vocab_size=2, layer_norm_eps=1e-12, initializer_range=initializer_range,
            pad_token_id=self.tokenizer.pad_token_id)
        if self.args.peer_model == "mlm":
            return self.transformers.BertForMaskedLM(bert_config)
        return self.transformers.BertForPreTraining(bert_config)

    def accuracy(self, model, batch_size: int = 256) -> float:
        """Held-out MLM accuracy: the records' masked input_ids, attention_mask = input_mask,
        token_type_ids = segment_ids; the vocabulary logits at masked_lm_positions (the
        encoder output gathered there, then the MLM head: the same logits as the head on
        every position, without computing the others); weight > 0 counted."""
        torch = self.torch
        head = model.cls if self.args.peer_model == "mlm" else model.cls.predictions
        h = self.heldout
        correct = total = 0
        model.eval()
        with torch.no_grad():
            for i in range(0, len(h["input_ids"]), batch_size):
                rows = slice(i, i + batch_size)
                hidden = model.bert(input_ids=h["input_ids"][rows],
                                    attention_mask=h["input_mask"][rows],
                                    token_type_ids=h["segment_ids"][rows]).last_hidden_state
                positions = h["masked_lm_positions"][rows]
                gathered = torch.gather(
                    hidden, 1, positions[..., None].expand(-1, -1, hidden.shape[-1]))
                predicted = head(gathered).argmax(-1)
                real = h["masked_lm_weights"][rows] > 0
                correct += int(((predicted == h["masked_lm_ids"][rows]) & real).sum())
                total += int(real.sum())
        model.train()
        return correct / max(total, 1)

    def trainer(self, model, recipe: PeerRecipe, steps: int, callbacks):
        transformers = self.transformers
        linear = recipe.end_learning_rate == 0 and recipe.decay_power == 1
        arguments = transformers.TrainingArguments(
            output_dir=str(self.workdir / recipe.name), max_steps=steps,
            per_device_train_batch_size=recipe.batch_size, learning_rate=recipe.learning_rate,
            lr_scheduler_type="linear" if linear else "polynomial",
            lr_scheduler_kwargs={} if linear else {"lr_end": recipe.end_learning_rate,
                                                   "power": recipe.decay_power},
            warmup_steps=recipe.warmup(steps), weight_decay=recipe.weight_decay,
            adam_beta1=recipe.beta_1, adam_beta2=recipe.beta_2, adam_epsilon=recipe.epsilon,
            max_grad_norm=recipe.clipnorm or 0.0, logging_steps=10 ** 9,
            eval_strategy="no", save_strategy="no", report_to=[], use_cpu=True,
            dataloader_num_workers=0, seed=self.args.seed, disable_tqdm=True)
        collator = transformers.DataCollatorForLanguageModeling(
            self.tokenizer, mlm_probability=recipe.masked_lm_prob)
        trainer = transformers.Trainer(model=model, args=arguments, train_dataset=self.examples,
                                       data_collator=collator, callbacks=callbacks)
        # Its end-of-training summary counts our evaluations as training time: not printed.
        trainer.remove_callback(transformers.PrinterCallback)
        return trainer

    def seconds_per_step(self, recipe: PeerRecipe) -> float:
        """The mean seconds of an optimizer step, from a short untimed run of the same
        Trainer (its first quarter left out: warm-up of the allocator and kernels); measured
        once per batch size (the recipes differ in nothing else that costs time)."""
        if recipe.batch_size in self.step_seconds:
            return self.step_seconds[recipe.batch_size]
        print(f"bench-quality: peer: timing {CALIBRATION_STEPS} untimed steps at batch "
              f"{recipe.batch_size} (the schedule's length = the steps that fit in the budget)",
              flush=True)
        times = []

        class Clock(self.transformers.TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                times.append(time.perf_counter())

        self.trainer(self.build_model(recipe.dropout, recipe.initializer_range), recipe,
                     CALIBRATION_STEPS, [Clock()]).train()
        skip = CALIBRATION_STEPS // 4
        self.step_seconds[recipe.batch_size] = (times[-1] - times[skip - 1]) / (len(times) - skip)
        return self.step_seconds[recipe.batch_size]

    def run(self, recipe: PeerRecipe, budget: float, every: float) -> dict:
        steps = self.args.peer_steps
        per_step = None
        if not steps:
            per_step = self.seconds_per_step(recipe)
            steps = int(budget / per_step)
            steps = max(steps, recipe.warmup(steps) + 1, 10)
        decay = "linear" if recipe.decay_power == 1 else f"power-{recipe.decay_power:g}"
        sized = f" (the budget at {per_step:.3f} s/step, measured)" if per_step else ""
        print(f"bench-quality: peer {recipe.label}: lr {recipe.learning_rate:g}, warmup "
              f"{recipe.warmup(steps)} steps, {decay} decay to {recipe.end_learning_rate:g} "
              f"over {steps} steps{sized}"
              + f", batch {recipe.batch_size}, weight decay {recipe.weight_decay:g}, betas "
              f"({recipe.beta_1:g}, {recipe.beta_2:g}), eps {recipe.epsilon:g}, clip "
              f"{recipe.clipnorm:g}, dropout {recipe.dropout:g}, init std "
              f"{recipe.initializer_range:g}", flush=True)
        watch = BudgetWatch(self, budget, every, self.transformers.TrainerCallback)
        model = self.build_model(recipe.dropout, recipe.initializer_range)
        started = time.perf_counter()
        self.trainer(model, recipe, steps, [watch.callback]).train()
        wall = time.perf_counter() - started
        return {"recipe": dataclasses.asdict(recipe), "schedule_steps": steps,
                "measured_seconds_per_step": per_step, "curve": watch.curve,
                "points": watch.points, "steps": watch.curve[-1][0],
                "train_seconds": watch.curve[-1][1], "eval_seconds": watch.eval_seconds,
                "wall_seconds": wall}


class BudgetWatch:
    """The peer's clock: training seconds without the evaluations; at 0 and every `every`
    of them the held-out accuracy (at the first step end at or after the point); at the
    budget, a last evaluation and the stop. `points` maps each point to its accuracy (points
    after an early end hold the final one)."""

    def __init__(self, peer: Peer, budget: float, every: float, base):
        self.peer, self.budget = peer, budget
        self.pending = table_points(budget, every)
        self.curve, self.points, self.eval_seconds = [], {}, 0.0
        self.started = None
        watch = self

        class Callback(base):
            def on_train_begin(self, args, state, control, model=None, **kwargs):
                watch.started = time.perf_counter()
                watch.evaluate(model, state.global_step)

            def on_step_end(self, args, state, control, model=None, **kwargs):
                seconds = watch.seconds()
                if watch.pending and seconds >= watch.pending[0]:
                    watch.evaluate(model, state.global_step, seconds)
                if seconds >= watch.budget:
                    control.should_training_stop = True

            def on_train_end(self, args, state, control, model=None, **kwargs):
                if watch.curve[-1][0] != state.global_step:  # ended by its schedule
                    watch.evaluate(model, state.global_step)
                for point in watch.pending:  # after the end: the final accuracy holds
                    watch.points[point] = watch.curve[-1][2]
                watch.pending = []

        self.callback = Callback()

    def seconds(self) -> float:
        return time.perf_counter() - self.started - self.eval_seconds

    def evaluate(self, model, step: int, seconds: float | None = None):
        seconds = self.seconds() if seconds is None else seconds
        paused = time.perf_counter()
        accuracy = self.peer.accuracy(model)
        self.eval_seconds += time.perf_counter() - paused
        self.curve.append([step, round(seconds, 3), accuracy])
        while self.pending and seconds >= self.pending[0]:
            self.points[self.pending.pop(0)] = accuracy
        print(f"  peer| step {step:>6}  {seconds:8.1f} s  held-out MLM accuracy "
              f"{accuracy:.4f}", flush=True)
        if len(self.curve) == 1:
            took = self.eval_seconds
            print(f"  peer| (an evaluation takes {took:.0f} s here: about "
                  f"{took * (len(self.pending) + 1) / 60:.0f} min of them besides the "
                  f"{self.budget / 60:.0f} min of training)", flush=True)


# The points of the table: the peer is evaluated there (BudgetWatch), and bench_quality.py
# prints its table at them.
def table_points(budget: float, every: float) -> list[float]:
    points = [round(k * every, 6) for k in range(int(budget // every) + 1)]
    return points + ([budget] if points[-1] < budget else [])

"""Published checkpoints as a start: `model.init_from` alone decides the model's sizes, its vocab
and casing; encoder-only checkpoints get new pretraining heads; cased checkpoints stay cased
through the data, fine-tuning and serving; every bad checkpoint is refused in one line.

The checkpoints are written here: a tiny `BertPretrainer` exported to a Hugging Face directory
(`models.convert.export_huggingface`), with its heads stripped for the encoder-only case.
"""

from __future__ import annotations

import json
import random
import shutil
import string

import keras
import mlflow
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from models import convert
from models.bert import BertEncoder
from models.pretraining import BertPretrainer
from pipeline import artifacts, cli
from pipeline import config as config_lib
from pipeline.finetuning import task_model
from pipeline.serving import export
from pipeline.text import vocab as vocab_lib

from tests.conftest import WORDS, make_corpus

LAYERS, HIDDEN, HEADS, INTERMEDIATE, POSITIONS = 2, 32, 2, 64, 128


def tiny_vocab(cased: bool) -> list:
    """Specials, punctuation, letters and pieces, and the test corpus's words (capitalised
    too when cased), so the corpus tokenizes into whole words."""
    letters = list(string.ascii_lowercase) + (list(string.ascii_uppercase) if cased else [])
    words = list(dict.fromkeys(WORDS + ([w.capitalize() for w in WORDS] if cased else [])))
    return list(dict.fromkeys(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
                              + list(string.punctuation) + letters + ["##" + c for c in letters]
                              + words))


def write_checkpoint(folder, cased=False, heads=True, activation="gelu", seed=0):
    """A Hugging Face BERT directory: config.json, model.safetensors, vocab.txt,
    tokenizer_config.json (do_lower_case), written by our exporter from a random model."""
    vocab = tiny_vocab(cased)
    keras.utils.set_random_seed(seed)
    encoder = BertEncoder(vocabulary_size=len(vocab), num_layers=LAYERS, num_heads=HEADS,
                          hidden_dim=HIDDEN, intermediate_dim=INTERMEDIATE,
                          max_sequence_length=POSITIONS, activation=activation)
    model = BertPretrainer(encoder, compile=False)
    convert.export_huggingface(model, vocab, folder, lowercase=not cased)
    if not heads:  # a bare BertModel: encoder + pooler, no cls.* tensors
        state = load_file(str(folder / "model.safetensors"))
        save_file({k: v for k, v in state.items() if not k.startswith("cls.")},
                  str(folder / "model.safetensors"))
    return folder


@pytest.fixture(scope="module")
def full_dir(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("full") / "bert-tiny-uncased")


@pytest.fixture(scope="module")
def cased_encoder_dir(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("cased") / "bert-tiny-cased", cased=True,
                            heads=False)


# ---------------------------------------------------------------------------
# The config: the checkpoint decides.
# ---------------------------------------------------------------------------
def test_init_from_alone_fills_sizes_vocab_and_casing(full_dir, cased_encoder_dir, caplog):
    config = config_lib.load(None, [f"model.init_from={full_dir}"])
    model = config.model
    assert (model.num_layers, model.hidden_dim, model.num_heads, model.intermediate_dim) == (
        LAYERS, HIDDEN, HEADS, INTERMEDIATE)
    assert (model.max_sequence_length, model.num_segments, model.activation) == (
        POSITIONS, 2, "gelu")
    assert model.layer_norm_epsilon == pytest.approx(1e-12)
    assert config.vocab.from_file == str(full_dir / "vocab.txt")
    assert config.vocab.lowercase is True and config.vocab.size == len(tiny_vocab(False))
    assert config_lib.model_architecture(config)["num_layers"] == LAYERS
    # The casing comes with the checkpoint (tokenizer_config.json do_lower_case: false).
    cased = config_lib.load(None, [f"model.init_from={cased_encoder_dir}"])
    assert cased.vocab.lowercase is False
    assert cased.vocab.size == len(tiny_vocab(True))

    # The demo config's BERT-tiny keys yield to a checkpoint given on the command line, and a
    # warning names each key replaced.
    with caplog.at_level("WARNING", logger="pipeline.config"):
        demo = config_lib.load("configs/pretrain_tiny.yaml", [f"model.init_from={full_dir}"])
    assert demo.model.hidden_dim == HIDDEN and demo.model.activation == "gelu"
    assert demo.vocab.size == len(tiny_vocab(False))
    assert "model.preset" in caplog.text and "vocab.size: 8000" in caplog.text
    assert "model.activation: 'gelu_approximate' -> 'gelu'" in caplog.text


def test_keys_that_contradict_the_checkpoint_are_refused(tmp_path, full_dir):
    # On the command line: refused, naming both values.
    with pytest.raises(config_lib.ConfigError) as err:
        config_lib.load(None, [f"model.init_from={full_dir}", "model.num_layers=3"])
    message = str(err.value)
    assert "model.num_layers = 3 (from the command line)" in message
    assert f"whose num_layers is {LAYERS}" in message and "\n" not in message
    with pytest.raises(config_lib.ConfigError, match=r"vocab.lowercase = False .* is True"):
        config_lib.load(None, [f"model.init_from={full_dir}", "vocab.lowercase=false"])
    with pytest.raises(config_lib.ConfigError, match="model.preset = 'base'"):
        config_lib.load(None, [f"model.init_from={full_dir}", "model.preset=base"])
    # In the same file as model.init_from: refused too.
    config_file = tmp_path / "mine.yaml"
    config_file.write_text(f"model:\n  init_from: {full_dir}\n  activation: gelu_approximate\n")
    with pytest.raises(config_lib.ConfigError, match=r"activation = 'gelu_approximate' \(from "
                                                     r"the config file\).* is 'gelu'"):
        config_lib.load(config_file)
    # Keys that agree are fine.
    same = config_lib.load(None, [f"model.init_from={full_dir}", f"model.hidden_dim={HIDDEN}",
                                  "model.activation=gelu", f"vocab.from_file={full_dir}/vocab.txt"])
    assert same.model.hidden_dim == HIDDEN


def bad_copy(tmp_path, source, name):
    target = tmp_path / name
    shutil.copytree(source, target)
    return target


def refusal(*overrides) -> str:
    """The one-line message (and exit 2) `python -m pipeline` gives for a bad checkpoint."""
    with pytest.raises(config_lib.ConfigError) as err:
        config_lib.load(None, list(overrides))
    message = str(err.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("model_type, name", [("roberta", "RoBERTa"), ("deberta-v2", "DeBERTa"),
                                              ("modernbert", "ModernBERT")])
def test_other_architectures_are_refused(tmp_path, full_dir, model_type, name):
    folder = bad_copy(tmp_path, full_dir, model_type)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": model_type}))
    message = refusal(f"model.init_from={folder}")
    assert name in message and "config.json" in message and "BERT" in message


def test_missing_corrupt_or_mismatched_files_are_refused(tmp_path, full_dir, capsys):
    # No weight file.
    folder = bad_copy(tmp_path, full_dir, "no-weights")
    (folder / "model.safetensors").unlink()
    assert "no weights" in refusal(f"model.init_from={folder}")
    # A truncated weight file (a download cut short).
    folder = bad_copy(tmp_path, full_dir, "truncated")
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 2])
    message = refusal(f"model.init_from={folder}")
    assert "model.safetensors" in message and "truncated" in message and "download" in message
    # Garbage where the header should be.
    (folder / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!")
    assert "not a readable safetensors file" in refusal(f"model.init_from={folder}")
    # A vocab.txt from another checkpoint (one row fewer than the embedding).
    folder = bad_copy(tmp_path, full_dir, "other-vocab")
    tokens = (folder / "vocab.txt").read_text().splitlines()
    (folder / "vocab.txt").write_text("\n".join(tokens[:-1]) + "\n")
    message = refusal(f"model.init_from={folder}")
    assert "vocab.txt" in message and f"{len(tokens) - 1:,} tokens" in message
    assert f"{len(tokens):,} rows" in message
    # Through the CLI: exit 2, one line on stderr, no traceback.
    assert cli.main(["pretrain", f"model.init_from={folder}", f"run_dir={tmp_path}/run"]) == 2
    err = capsys.readouterr().err.strip()
    assert "vocab.txt" in err and "Traceback" not in err and len(err.splitlines()) == 1


def test_imported_vocab_carries_its_casing(tmp_path, cased_encoder_dir, capsys):
    out = tmp_path / "imported" / "model.keras"
    from models.convert import __main__ as convert_cli

    assert convert_cli.main(["import-hf", str(cased_encoder_dir), "--out", str(out)]) == 0
    capsys.readouterr()
    assert json.loads((out.parent / "vocab.json").read_text())["lowercase"] is False
    config = config_lib.load(None, [f"model.init_from={out}"])
    assert config.vocab.lowercase is False and config.vocab.from_file == str(out.parent / "vocab.txt")


# ---------------------------------------------------------------------------
# Continued pretraining end to end: an encoder-only, cased checkpoint, no other key.
# ---------------------------------------------------------------------------
@pytest.mark.slow
def test_continue_pretraining_from_an_encoder_only_cased_checkpoint(tmp_path, cased_encoder_dir,
                                                                    capsys):
    corpus = tmp_path / "raw"
    make_corpus(corpus, documents=30)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    args = [f"run_dir={tmp_path / 'run'}", f"corpus.path={corpus}/*.txt",
            f"tracking.tracking_uri={uri}", "tracking.experiment=init",
            f"model.init_from={cased_encoder_dir}", "train.head_warmup_steps=3",
            "train.head_warmup_until_plateau=false"]
    assert cli.main(["all", "--config", "configs/test_tiny.yaml", *args]) == 0
    out = capsys.readouterr().out
    assert "held-out MLM accuracy before the first update (step 0)" in out
    assert "no pretraining heads; new, randomly initialised: " in out and "mlm_head" in out
    # The new heads warmed up alone for 3 updates, then the encoder unfroze.
    assert "head warm-up: only mlm_head, nsp_head train" in out
    assert "head warm-up ended at step 3 (its 3 updates done); held-out MLM accuracy" in out
    paths = artifacts.Artifacts(tmp_path / "run")
    # The run's vocab is the checkpoint's, with its casing, and the data was tokenized cased.
    assert paths.vocab_file.read_text() == (cased_encoder_dir / "vocab.txt").read_text()
    assert json.loads(paths.vocab_meta.read_text())["lowercase"] is False
    assert vocab_lib.vocab_lowercase(paths.vocab_file, True) is False
    # The model trained is the checkpoint's architecture, with its encoder weights at step 0.
    pretrained = keras.saving.load_model(paths.model_keras, compile=False)
    assert convert.architecture_of(pretrained)["num_layers"] == LAYERS
    client = mlflow.MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("init")
    run = next(r for r in client.search_runs([experiment.experiment_id])
               if r.data.tags.get("pipeline.stage") == "pretrain")
    probes = client.get_metric_history(run.info.run_id, "heldout_mlm_accuracy")
    assert [m.step for m in probes][:1] == [0] and len(probes) >= 2
    # Step 0, the unfreeze (step 3) and the curve after it.
    assert [m.step for m in probes] == [0, 3, 6]
    at_unfreeze = client.get_metric_history(run.info.run_id, "heldout_mlm_accuracy_at_unfreeze")
    assert [(m.step, m.value) for m in at_unfreeze] == [(3, probes[1].value)]
    assert run.data.tags["pretrain.head_warmup.unfreeze_step"] == "3"
    assert run.data.tags["pretrain.head_warmup.steps"] == "3"
    new = run.data.tags["pretrain.init_from.new_weights"]
    assert "mlm_head" in new and "nsp_head" in new and "transformer_layer" not in new
    assert run.data.params["model.hidden_dim"] == str(HIDDEN)
    assert run.data.params["vocab.lowercase"] == "False"


# ---------------------------------------------------------------------------
# Fine-tuning straight from a checkpoint directory, cased through serving.
# ---------------------------------------------------------------------------
@pytest.mark.slow
def test_finetune_from_a_cased_checkpoint_directory_serves_cased(tmp_path, cased_encoder_dir):
    from pipeline.finetuning import train as finetuning

    rng = random.Random(0)
    rows = ["text,label"] + [
        f"{rng.choice(['The', 'A'])} {rng.choice(['cat', 'dog'] if i % 2 else ['house', 'tree'])} "
        f"sat near the {rng.choice(WORDS)}.,{'animal' if i % 2 else 'place'}" for i in range(40)]
    (tmp_path / "train.csv").write_text("\n".join(rows) + "\n")
    config = config_lib.load(None, [
        f"run_dir={tmp_path}/run", f"finetune.init_from={cased_encoder_dir}",
        "finetune.dataset=csv", f"finetune.train_file={tmp_path}/train.csv", "finetune.name=t",
        "finetune.max_seq_length=16", "finetune.batch_size=8", "finetune.epochs=1",
        "finetune.baselines=false"])
    model_path, vocab_path = task_model.resolve_init(config)
    assert model_path.suffix == ".keras" and vocab_lib.vocab_lowercase(vocab_path, True) is False
    assert task_model.resolve_init(config)[0] == model_path  # imported once, then reused
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db")
    try:
        experiment = mlflow.create_experiment("t", artifact_location=(tmp_path / "art").as_uri())
        with mlflow.start_run(experiment_id=experiment):
            finetuning.fine_tune(config)
    finally:
        mlflow.set_tracking_uri(None)
    paths = artifacts.Artifacts(config.run_dir).finetune("t")
    assert json.loads(paths.task_json.read_text())["lowercase"] is False
    vocab = tiny_vocab(True)
    ids = export.saved_model_token_ids(paths.saved_model, ["The the"])[0]
    assert ids == [vocab.index("The"), vocab.index("the")]
    assert np.all(np.asarray(ids) >= 0)


# ---------------------------------------------------------------------------
# The vocabulary travels with the model: a run directory without a vocab of its own starts
# from another run's model.keras, with that model's vocab and casing.
# ---------------------------------------------------------------------------
@pytest.mark.slow
def test_a_pretrained_model_carries_its_vocab_and_casing_to_another_run(tmp_path, capsys):
    corpus = tmp_path / "raw"
    make_corpus(corpus, documents=30)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracking = [f"tracking.tracking_uri={uri}", "tracking.experiment=travel"]
    first = tmp_path / "first"
    assert cli.main(["all", "--config", "configs/test_tiny.yaml", f"run_dir={first}",
                     f"corpus.path={corpus}/*.txt", "vocab.lowercase=false", *tracking]) == 0
    pretrained = artifacts.Artifacts(first)
    model = pretrained.model_keras
    # Beside model.keras: the run's vocab and its casing.
    assert (model.parent / "vocab.txt").read_text() == pretrained.vocab_file.read_text()
    assert json.loads((model.parent / "vocab.json").read_text())["lowercase"] is False

    # Fine-tuning in another run directory, which has no vocab/ of its own.
    rng = random.Random(0)
    rows = ["text,label"] + [
        f"{rng.choice(['The', 'A'])} {rng.choice(['cat', 'dog'] if i % 2 else ['house', 'tree'])} "
        f"sat near the {rng.choice(WORDS)}.,{'animal' if i % 2 else 'place'}" for i in range(40)]
    (tmp_path / "train.csv").write_text("\n".join(rows) + "\n")
    second = tmp_path / "second"
    assert cli.main(["finetune", f"run_dir={second}", f"finetune.init_from={model}",
                     "finetune.dataset=csv", f"finetune.train_file={tmp_path}/train.csv",
                     "finetune.name=t", "finetune.max_seq_length=16", "finetune.batch_size=8",
                     "finetune.epochs=1", "finetune.baselines=false", *tracking]) == 0
    capsys.readouterr()
    assert not artifacts.Artifacts(second).vocab_dir.exists()
    tuned = artifacts.Artifacts(second).finetune("t")
    assert json.loads(tuned.task_json.read_text())["lowercase"] is False
    vocab = vocab_lib.read_vocab(model.parent / "vocab.txt")
    assert tuned.vocab_file.read_text() == (model.parent / "vocab.txt").read_text()
    # Cased through serving: "The" and "the" are different pieces.
    ids = export.saved_model_token_ids(tuned.saved_model, ["The the"])[0]
    assert ids[-1] == vocab.index("the") and ids[0] != ids[-1]

    # The fine-tuned model carries them too: a third run starts from it.
    third = config_lib.load(None, [f"run_dir={tmp_path}/third",
                                   f"finetune.init_from={tuned.model_keras}"])
    model_path, vocab_path = task_model.resolve_init(third)
    assert vocab_path == tuned.vocab_file and vocab_lib.vocab_lowercase(vocab_path, True) is False
    # Continued pretraining from the pretrained model in another run: its vocab and casing.
    continued = config_lib.load("configs/test_tiny.yaml", [f"run_dir={tmp_path}/fourth",
                                                           f"model.init_from={model}"])
    assert continued.vocab.from_file == str(model.parent / "vocab.txt")
    assert continued.vocab.lowercase is False


def test_a_model_without_its_vocab_is_refused_in_one_line(tmp_path):
    from pipeline.finetuning.task_model import FinetuneError

    folder = tmp_path / "bare"
    folder.mkdir()
    (folder / "model.keras").write_bytes(b"not read: the vocab is looked for first")
    config = config_lib.load(None, [f"run_dir={tmp_path}/run",
                                    f"finetune.init_from={folder / 'model.keras'}"])
    with pytest.raises(FinetuneError) as err:
        task_model.resolve_init(config)
    message = str(err.value)
    assert "no vocab.txt beside it" in message and "finetune.vocab_file" in message
    assert "\n" not in message
    # A pretrain run's model.keras written before the vocab went beside it: its run's vocab.
    run = tmp_path / "old"
    (run / "pretrain").mkdir(parents=True)
    (run / "vocab").mkdir()
    (run / "pretrain" / "model.keras").write_bytes(b"")
    (run / "vocab" / "vocab.txt").write_text("[PAD]\n")
    old = config_lib.load(None, [f"run_dir={tmp_path}/run",
                                 f"finetune.init_from={run / 'pretrain' / 'model.keras'}"])
    assert task_model.resolve_init(old)[1] == run / "vocab" / "vocab.txt"

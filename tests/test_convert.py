"""Checkpoint import/export (models/convert) against the reference implementation.

The reference is Hugging Face `transformers` (torch, CPU): a randomly initialised
`BertForPreTraining` with a small config is saved, imported, and both models run
on the same inputs. Sequence output, pooled output, MLM logits (at the masked
positions) and NSP logits must agree to max |diff| <= 1e-4 in float32. The same
weights are written as a Google TF1 checkpoint under google-research/bert's
variable names. transformers and torch are test-only dependencies
(requirements-test.txt, installed by `make test`); without them these tests fail.
"""

from __future__ import annotations

import json
import string

import numpy as np
import pytest
import torch  # noqa: E402  (test-only dependency: requirements-test.txt)
import transformers  # noqa: E402

from models import convert  # noqa: E402
from models.convert import __main__ as convert_cli  # noqa: E402

TOLERANCE = 1e-4
HIDDEN, LAYERS, HEADS, INTERMEDIATE, POSITIONS = 64, 2, 4, 128, 128
BATCH, SEQ, NUM_MASKED = 3, 16, 4
# Every measured max |diff|, printed at the end of the module (pytest -s shows it).
MEASURED: dict = {}


def write_test_vocab(path) -> list:
    """~120 tokens: Google-like specials, punctuation, letters, pieces, a few words."""
    letters = list(string.ascii_lowercase)
    tokens = (["[PAD]", "[unused0]", "[unused1]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
              + list(string.punctuation) + letters + ["##" + c for c in letters]
              + ["the", "cafe", "naive", "run", "##ing", "中", "文", "日", "本",
                 "é", "##é", "ü", "##ü", "д", "##д"])
    path.write_text("".join(t + "\n" for t in tokens), encoding="utf-8")
    return tokens


def hf_config(vocab_size: int, hidden_act: str):
    return transformers.BertConfig(
        vocab_size=vocab_size, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, intermediate_size=INTERMEDIATE,
        max_position_embeddings=POSITIONS, type_vocab_size=2, hidden_act=hidden_act,
        layer_norm_eps=1e-12)


def randomize(model, seed: int = 0):
    """Every parameter random and O(0.1), so a transposed bias or a wrong LayerNorm shows."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            if "LayerNorm.weight" in name:
                param.copy_(1.0 + 0.1 * noise)
            else:
                param.copy_(0.1 * noise)
    model.tie_weights()
    return model.eval()


def make_inputs(vocab_size: int, seed: int = 1) -> dict:
    rng = np.random.default_rng(seed)
    token_ids = rng.integers(5, vocab_size, size=(BATCH, SEQ)).astype("int32")
    token_ids[:, 0] = 4  # [CLS]
    padding_mask = np.ones((BATCH, SEQ), "int32")
    padding_mask[1, 11:] = 0  # one padded row
    token_ids[1, 11:] = 0
    segment_ids = np.zeros((BATCH, SEQ), "int32")
    segment_ids[:, SEQ // 2:] = 1
    mask_positions = np.stack([rng.choice(np.arange(1, 11), NUM_MASKED, replace=False)
                               for _ in range(BATCH)]).astype("int32")
    return {"token_ids": token_ids, "segment_ids": segment_ids, "padding_mask": padding_mask,
            "mask_positions": mask_positions}


def hf_outputs(model, x) -> dict:
    ids = torch.tensor(x["token_ids"], dtype=torch.long)
    kwargs = dict(input_ids=ids, token_type_ids=torch.tensor(x["segment_ids"], dtype=torch.long),
                  attention_mask=torch.tensor(x["padding_mask"], dtype=torch.long))
    with torch.no_grad():
        encoder = model.bert(**kwargs)
        heads = model(**kwargs)
    logits = heads.prediction_logits.numpy()
    return {
        "sequence_output": encoder.last_hidden_state.numpy(),
        "pooled_output": encoder.pooler_output.numpy(),
        "mlm": np.take_along_axis(logits, x["mask_positions"][..., None].astype("int64"), axis=1),
        "nsp": heads.seq_relationship_logits.numpy(),
    }


def our_outputs(model, x) -> dict:
    encoder_inputs = {k: x[k] for k in ("token_ids", "segment_ids", "padding_mask")}
    encoder = model.backbone(encoder_inputs, training=False)
    heads = model(x, training=False)
    out = {**encoder, **heads}
    return {k: np.asarray(out[k]) for k in ("sequence_output", "pooled_output", "mlm", "nsp")}


def max_diffs(a: dict, b: dict) -> dict:
    return {k: float(np.max(np.abs(a[k] - b[k]))) for k in a}


def assert_close(name: str, ours: dict, reference: dict, tolerance: float = TOLERANCE):
    diffs = max_diffs(ours, reference)
    MEASURED[name] = diffs
    assert all(d <= tolerance for d in diffs.values()), f"{name}: max |diff| {diffs}"
    return diffs


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    """A saved random BertForPreTraining (exact GELU) with its vocab, and the reference outputs."""
    folder = tmp_path_factory.mktemp("hf")
    vocab = write_test_vocab(folder / "vocab.txt")
    model = randomize(transformers.BertForPreTraining(hf_config(len(vocab), "gelu")))
    model.save_pretrained(folder)  # model.safetensors + config.json
    (folder / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
    x = make_inputs(len(vocab))
    return {"dir": folder, "model": model, "vocab": vocab, "x": x, "expected": hf_outputs(model, x)}


@pytest.fixture(scope="module")
def imported_hf(hf_dir):
    return convert.import_huggingface(hf_dir["dir"])


@pytest.fixture(scope="module", autouse=True)
def report():
    yield
    for name, diffs in MEASURED.items():
        print(f"\n{name}: " + ", ".join(f"{k} {v:.2e}" for k, v in diffs.items()))


# ---------------------------------------------------------------------------
# Hugging Face import.
# ---------------------------------------------------------------------------
def test_import_huggingface_matches_transformers(hf_dir, imported_hf):
    assert imported_hf.architecture["activation"] == "gelu"  # hidden_act "gelu" = exact erf
    assert imported_hf.architecture["vocabulary_size"] == len(hf_dir["vocab"])
    assert imported_hf.architecture["max_sequence_length"] == POSITIONS
    assert imported_hf.vocab == hf_dir["vocab"] and imported_hf.lowercase is True
    assert imported_hf.missing == []
    assert_close("hf import", our_outputs(imported_hf.model, hf_dir["x"]), hf_dir["expected"])


def test_wrong_activation_gives_a_larger_diff(hf_dir, imported_hf):
    """The same weights with the tanh GELU: measurably off, so the activation must follow the config."""
    arch = {**imported_hf.architecture, "activation": "gelu_approximate"}
    wrong, _ = convert.build_pretrainer(arch, convert.keras_weights(imported_hf.model))
    diffs = max_diffs(our_outputs(wrong, hf_dir["x"]), hf_dir["expected"])
    MEASURED["wrong activation (tanh GELU vs erf checkpoint)"] = diffs
    right = MEASURED.get("hf import") or max_diffs(our_outputs(imported_hf.model, hf_dir["x"]),
                                                   hf_dir["expected"])
    assert max(diffs.values()) > TOLERANCE
    assert max(diffs.values()) > 10 * max(right.values())


def test_import_bare_encoder_and_old_names(tmp_path, hf_dir):
    """`BertModel` files (no `bert.` prefix, no heads) and LayerNorm gamma/beta names load;
    the missing heads are reported and keep their initialisation."""
    from safetensors.numpy import save_file

    state = {k[len("bert."):]: v.numpy() for k, v in hf_dir["model"].state_dict().items()
             if k.startswith("bert.") and "pooler" not in k}
    state = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias",
                                                                      "LayerNorm.beta"): v
             for k, v in state.items()}
    save_file(state, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text((hf_dir["dir"] / "config.json").read_text())
    (tmp_path / "vocab.txt").write_text((hf_dir["dir"] / "vocab.txt").read_text())
    with pytest.warns(UserWarning, match="random"):
        imported = convert.import_huggingface(tmp_path)
    assert sorted(imported.missing) == sorted(
        p for p in convert.keras_weights(imported.model) if p.startswith(convert.HEAD_PREFIXES))
    ours = our_outputs(imported.model, hf_dir["x"])
    assert np.max(np.abs(ours["sequence_output"] - hf_dir["expected"]["sequence_output"])) <= TOLERANCE


def test_import_pytorch_bin_and_bfloat16_safetensors(tmp_path, hf_dir):
    """pytorch_model.bin (torch) and bfloat16 safetensors (widened by hand) give the same weights."""
    from safetensors.torch import save_file

    state = hf_dir["model"].state_dict()
    for name in ("config.json", "vocab.txt"):
        for sub in ("bin", "bf16"):
            (tmp_path / sub).mkdir(exist_ok=True)
            (tmp_path / sub / name).write_text((hf_dir["dir"] / name).read_text())
    torch.save(state, tmp_path / "bin" / "pytorch_model.bin")
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in state.items()
               if k != "cls.predictions.decoder.weight"}, str(tmp_path / "bf16" / "model.safetensors"))
    word = state["bert.embeddings.word_embeddings.weight"]
    from_bin = convert.keras_weights(convert.import_huggingface(tmp_path / "bin").model)
    np.testing.assert_array_equal(from_bin["token_embedding/embeddings"], word.numpy())
    from_bf16 = convert.keras_weights(convert.import_huggingface(tmp_path / "bf16").model)
    np.testing.assert_array_equal(from_bf16["token_embedding/embeddings"],
                                  word.to(torch.bfloat16).float().numpy())


def test_refuses_other_models(tmp_path, hf_dir):
    config = json.loads((hf_dir["dir"] / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "model_type": "roberta"}))
    with pytest.raises(convert.ConversionError, match="roberta"):
        convert.import_huggingface(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**config, "hidden_act": "silu"}))
    with pytest.raises(convert.ConversionError, match="silu"):
        convert.import_huggingface(tmp_path)


# ---------------------------------------------------------------------------
# Google import.
# ---------------------------------------------------------------------------
def google_variables(state: dict) -> dict:
    """HF BertForPreTraining state dict → google-research/bert variable names and layouts.

    Written independently of models/convert (string mapping + transposes only).
    """
    s = {k: v.numpy() for k, v in state.items()}
    out = {
        "bert/embeddings/word_embeddings": s["bert.embeddings.word_embeddings.weight"],
        "bert/embeddings/position_embeddings": s["bert.embeddings.position_embeddings.weight"],
        "bert/embeddings/token_type_embeddings": s["bert.embeddings.token_type_embeddings.weight"],
        "bert/embeddings/LayerNorm/gamma": s["bert.embeddings.LayerNorm.weight"],
        "bert/embeddings/LayerNorm/beta": s["bert.embeddings.LayerNorm.bias"],
        "bert/pooler/dense/kernel": s["bert.pooler.dense.weight"].T,
        "bert/pooler/dense/bias": s["bert.pooler.dense.bias"],
        "cls/predictions/transform/dense/kernel": s["cls.predictions.transform.dense.weight"].T,
        "cls/predictions/transform/dense/bias": s["cls.predictions.transform.dense.bias"],
        "cls/predictions/transform/LayerNorm/gamma": s["cls.predictions.transform.LayerNorm.weight"],
        "cls/predictions/transform/LayerNorm/beta": s["cls.predictions.transform.LayerNorm.bias"],
        "cls/predictions/output_bias": s["cls.predictions.bias"],
        "cls/seq_relationship/output_weights": s["cls.seq_relationship.weight"],  # (2, H)
        "cls/seq_relationship/output_bias": s["cls.seq_relationship.bias"],
    }
    for i in range(LAYERS):
        h, g = f"bert.encoder.layer.{i}.", f"bert/encoder/layer_{i}/"
        pairs = [("attention.self.query", "attention/self/query"),
                 ("attention.self.key", "attention/self/key"),
                 ("attention.self.value", "attention/self/value"),
                 ("attention.output.dense", "attention/output/dense"),
                 ("intermediate.dense", "intermediate/dense"),
                 ("output.dense", "output/dense")]
        for hf_name, google_name in pairs:
            out[g + google_name + "/kernel"] = s[h + hf_name + ".weight"].T
            out[g + google_name + "/bias"] = s[h + hf_name + ".bias"]
        for hf_name, google_name in [("attention.output.LayerNorm", "attention/output/LayerNorm"),
                                     ("output.LayerNorm", "output/LayerNorm")]:
            out[g + google_name + "/gamma"] = s[h + hf_name + ".weight"]
            out[g + google_name + "/beta"] = s[h + hf_name + ".bias"]
    return {k: np.ascontiguousarray(v, dtype="float32") for k, v in out.items()}


def write_google_checkpoint(folder, variables: dict, config: dict, vocab_text: str):
    """A TF1 checkpoint (tf.compat.v1 variables + Saver) as run_pretraining.py writes it."""
    import tensorflow as tf

    folder.mkdir(parents=True, exist_ok=True)
    with tf.Graph().as_default():
        for name, value in variables.items():
            tf.compat.v1.get_variable(name, initializer=tf.constant(value))
            # run_pretraining.py checkpoints also hold Adam slots; the importer skips them.
            if name.endswith("query/kernel"):
                tf.compat.v1.get_variable(name + "/adam_m", initializer=tf.zeros_like(value))
        tf.compat.v1.train.get_or_create_global_step()
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            saver.save(session, str(folder / "bert_model.ckpt"), write_meta_graph=False)
    (folder / "bert_config.json").write_text(json.dumps(config))
    (folder / "vocab.txt").write_text(vocab_text, encoding="utf-8")


def test_import_google_checkpoint_matches_reference(tmp_path, hf_dir):
    """Google's "gelu" is the tanh form: the reference is the same weights under gelu_new."""
    vocab_size = len(hf_dir["vocab"])
    reference = transformers.BertForPreTraining(hf_config(vocab_size, "gelu_new")).eval()
    reference.load_state_dict(hf_dir["model"].state_dict())
    expected = hf_outputs(reference, hf_dir["x"])
    folder = tmp_path / "uncased_L-2_H-64_A-4"
    write_google_checkpoint(
        folder, google_variables(hf_dir["model"].state_dict()),
        {"attention_probs_dropout_prob": 0.1, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
         "hidden_size": HIDDEN, "initializer_range": 0.02, "intermediate_size": INTERMEDIATE,
         "max_position_embeddings": POSITIONS, "num_attention_heads": HEADS,
         "num_hidden_layers": LAYERS, "type_vocab_size": 2, "vocab_size": vocab_size},
        (hf_dir["dir"] / "vocab.txt").read_text(encoding="utf-8"))
    imported = convert.import_google(folder)
    assert imported.architecture["activation"] == "gelu_approximate"
    assert imported.architecture["layer_norm_epsilon"] == 1e-12
    assert imported.lowercase is True and imported.missing == []
    assert_close("google import", our_outputs(imported.model, hf_dir["x"]), expected)

    # model.init_from alone: the Google directory decides the sizes, the tanh GELU, the vocab
    # and (from its name, uncased_…) the casing.
    from pipeline import config as config_lib

    config = config_lib.load(None, [f"model.init_from={folder}", "data.max_seq_length=64"])
    assert (config.model.num_layers, config.model.hidden_dim) == (LAYERS, HIDDEN)
    assert config.model.activation == "gelu_approximate" and config.vocab.lowercase is True
    assert config.vocab.from_file == str(folder / "vocab.txt")
    # A data file cut short: one line naming the checkpoint and what to do.
    data_file = next(folder.glob("bert_model.ckpt.data-*"))
    data_file.write_bytes(data_file.read_bytes()[:100])
    with pytest.raises(convert.ConversionError, match=r"bert_model.ckpt.index / .data-\*: not a "
                                                      r"readable TensorFlow checkpoint .*download"):
        convert.import_google(folder)
    data_file.unlink()
    with pytest.raises(config_lib.ConfigError, match="data file .* is missing"):
        config_lib.load(None, [f"model.init_from={folder}"])


# ---------------------------------------------------------------------------
# Export and round trip.
# ---------------------------------------------------------------------------
def test_round_trip_ours_to_hf_to_ours(tmp_path, hf_dir, imported_hf):
    out = convert.export_huggingface(imported_hf.model, hf_dir["dir"] / "vocab.txt", tmp_path / "hf")
    config = json.loads((out / "config.json").read_text())
    assert config["hidden_act"] == "gelu" and config["layer_norm_eps"] == 1e-12
    reloaded, info = transformers.BertForPreTraining.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert_close("export → transformers", hf_outputs(reloaded.eval(), hf_dir["x"]),
                 hf_dir["expected"])
    tokenizer = transformers.BertTokenizerFast.from_pretrained(out)
    assert tokenizer.do_lower_case is True
    assert tokenizer("Café run")["input_ids"] == transformers.BertTokenizerFast(
        str(hf_dir["dir"] / "vocab.txt"), do_lower_case=True)("Café run")["input_ids"]
    again = convert.import_huggingface(out)
    ours_before = our_outputs(imported_hf.model, hf_dir["x"])
    assert_close("round trip ours → HF → ours", our_outputs(again.model, hf_dir["x"]), ours_before,
                 tolerance=1e-6)


def test_export_tanh_model_writes_gelu_new(tmp_path, hf_dir, imported_hf):
    arch = {**imported_hf.architecture, "activation": "gelu_approximate"}
    model, _ = convert.build_pretrainer(arch, convert.keras_weights(imported_hf.model))
    out = convert.export_huggingface(model, hf_dir["vocab"], tmp_path / "hf")
    assert json.loads((out / "config.json").read_text())["hidden_act"] == "gelu_new"
    reloaded = transformers.BertForPreTraining.from_pretrained(out).eval()
    assert_close("export tanh model → transformers (gelu_new)", hf_outputs(reloaded, hf_dir["x"]),
                 our_outputs(model, hf_dir["x"]))


def test_cli_import_and_export(tmp_path, hf_dir, capsys):
    keras_file = tmp_path / "imported" / "model.keras"
    assert convert_cli.main(["import-hf", str(hf_dir["dir"]), "--out", str(keras_file)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["lowercase"] is True and summary["architecture"]["activation"] == "gelu"
    assert (keras_file.parent / "vocab.txt").read_text() == (hf_dir["dir"] / "vocab.txt").read_text()
    loaded = convert.load_pretrainer(keras_file)
    assert loaded.vocab == hf_dir["vocab"]
    assert_close(".keras from the CLI", our_outputs(loaded.model, hf_dir["x"]), hf_dir["expected"])
    assert convert_cli.main(["export-hf", str(keras_file), "--vocab",
                             str(keras_file.parent / "vocab.txt"), "--out",
                             str(tmp_path / "hf")]) == 0
    assert (tmp_path / "hf" / "model.safetensors").is_file()
    assert convert_cli.main(["import-google", str(tmp_path), "--out", str(keras_file)]) == 2
    assert "bert_config.json" in capsys.readouterr().err


# ---------------------------------------------------------------------------
# Tokenizer parity with BertTokenizerFast.
# ---------------------------------------------------------------------------
PARITY_TEXTS = [
    "The café is naïve!", "Zürich, ZÜRICH and zurich.", "中文日本語 mixed中文text",
    "running runs (ran) [so] {on}... ¿qué? ¡sí!", "unknownwordxyz qqq ÆØÅ",
    "a" * 99, "a" * 100, "a" * 101, "supercalifragilistic" * 4, "é" * 30,
    "Hello [MASK] world [SEP] [CLS]", "tabs\tand\nnewlines   spaces",
    "$100 & 50% off #1 @user — “quotes” ‘single’", "emoji 😀 ok", "İstanbul Ǆ", "д" * 50,
    "× ÷ ≠ … • ½", "",
]
# Where Hugging Face differs from Google's rules, which ours follow (models/tokenizer.py; the
# full list is in tests/test_tokenizer.py): it deletes private-use characters, and its Rust
# lowercasing has no final sigma. Its default word limit (100 characters) is set to Google's 200.
KNOWN_DIFFERENCES = [("a\ue000b", True), ("a\ue000b", False), ("ΟΔΟΣ", True)]


@pytest.mark.parametrize("lowercase", [True, False])
def test_tokenizer_parity_with_bert_tokenizer_fast(tmp_path, lowercase):
    vocab_file = tmp_path / "vocab.txt"
    tokens = write_test_vocab(vocab_file)
    extra = ["The", "Café", "Zürich", "café", "ÆØÅ", "##ø", "οδος", "οδοσ"]
    vocab_file.write_text("".join(t + "\n" for t in tokens + extra), encoding="utf-8")
    ours = convert.tokenizer_from_vocab(vocab_file, lowercase=lowercase)
    reference = transformers.BertTokenizerFast(str(vocab_file), do_lower_case=lowercase)
    reference.backend_tokenizer.model.max_input_chars_per_word = 200
    for text in PARITY_TEXTS + ["a" * 199, "a" * 200, "a" * 201, "ß Ⅻ ﬁne Ｆｕｌｌ ½ a… b"]:
        expected = reference(text, add_special_tokens=False)["input_ids"]
        got = np.asarray(ours(text)).tolist()
        assert got == expected, (text, reference.convert_ids_to_tokens(expected),
                                 reference.convert_ids_to_tokens(got))
    for text, case in KNOWN_DIFFERENCES:
        if case == lowercase:
            expected = reference(text, add_special_tokens=False)["input_ids"]
            assert np.asarray(ours(text)).tolist() != expected, (
                f"{text!r} now tokenizes like Hugging Face: update models/tokenizer.py's notes")


# ---------------------------------------------------------------------------
# model.init_from in the pretrain stage.
# ---------------------------------------------------------------------------
def init_from_config(path, **model):
    from pipeline import config as config_lib

    model = {"num_layers": LAYERS, "hidden_dim": HIDDEN, "num_heads": HEADS,
             "intermediate_dim": INTERMEDIATE, "max_sequence_length": POSITIONS,
             "activation": "gelu", "init_from": str(path), **model}
    return config_lib.load(None, [f"model.{k}={v}" for k, v in model.items()]
                           + ["data.max_seq_length=64"])


def test_init_from_copies_weights_and_refuses_mismatches(tmp_path, hf_dir, imported_hf):
    from pipeline import config as config_lib
    from pipeline.training import pretrainer

    keras_file = tmp_path / "model.keras"
    imported_hf.model.save(str(keras_file))
    convert.write_vocab(hf_dir["vocab"], tmp_path / "vocab.txt")
    run_vocab = tmp_path / "run_vocab.txt"
    convert.write_vocab(hf_dir["vocab"], run_vocab)
    vocab_size = len(hf_dir["vocab"])

    config = init_from_config(keras_file)
    model = pretrainer.build_model(config, vocab_size)
    pretrainer.init_from_checkpoint(model, config, run_vocab)
    assert_close("init_from (.keras)", our_outputs(model, hf_dir["x"]), hf_dir["expected"])

    # A Hugging Face directory works directly too.
    config = init_from_config(hf_dir["dir"])
    model = pretrainer.build_model(config, vocab_size)
    pretrainer.init_from_checkpoint(model, config, run_vocab)

    # Vocabulary size: the run's vocab has 8000 tokens, the checkpoint's 120-odd.
    with pytest.raises(pretrainer.PretrainError, match=rf"{vocab_size} tokens .* has 8000"):
        pretrainer.init_from_checkpoint(pretrainer.build_model(config, 8000), config, run_vocab)
    # Architecture: a config that contradicts the checkpoint is refused when it is loaded
    # (tests/test_init_from.py); a Config built otherwise (from_dict: no checkpoint lookup) is
    # still checked when the weights are copied, both values named, and the overrides that fix it.
    with pytest.raises(config_lib.ConfigError, match="model.num_layers = 3"):
        init_from_config(keras_file, num_layers=3)
    raw = {"model": {"num_layers": 3, "hidden_dim": HIDDEN, "num_heads": HEADS,
                     "intermediate_dim": INTERMEDIATE, "max_sequence_length": POSITIONS,
                     "activation": "gelu_approximate", "init_from": str(keras_file)},
           "data": {"max_seq_length": 64}}
    config = config_lib.from_dict(raw, "test")
    with pytest.raises(pretrainer.PretrainError) as err:
        pretrainer.init_from_checkpoint(pretrainer.build_model(config, vocab_size), config, run_vocab)
    message = str(err.value)
    assert "model.num_layers: config 3, checkpoint 2" in message
    assert "model.activation: config 'gelu_approximate', checkpoint 'gelu'" in message
    assert "model.num_layers=2 model.activation=gelu" in message
    # Same size, other tokens.
    convert.write_vocab(list(reversed(hf_dir["vocab"])), run_vocab)
    config = init_from_config(keras_file)
    with pytest.raises(pretrainer.PretrainError, match="vocab differs"):
        pretrainer.init_from_checkpoint(pretrainer.build_model(config, vocab_size), config, run_vocab)
    # A path that is no checkpoint is a config error.
    with pytest.raises(config_lib.ConfigError, match="model.init_from"):
        init_from_config(tmp_path / "nothing-here")

"""Tests for pipeline/inspection/ and pipeline/tools/inspect_model.py: fill-mask, nsp, attention maps, embeddings, the CLI.

One tiny BERT (2 layers, hidden 32) is trained here, in about a second, on four
sentences that follow each other in a cycle, so it must learn the planted last
word of each ("the cat sat on the [MASK]" → "mat") and which sentence comes next.
Attention and embedding checks use an untrained 2-layer model with dropout (the
functions must run in inference mode).
"""

from __future__ import annotations

import json

import keras
import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image

import models
from pipeline import cli
from pipeline.inspection import plots, probes
from pipeline.text import tokenizer as tokenizer_lib

# The tests read one module fixture, a tiny model trained for 60 epochs and exported
# (about 50 s): the file is slow as a whole.
pytestmark = pytest.mark.slow

SENTENCES = [
    "the cat sat on the mat",
    "the dog ran to the park",
    "a bird flew over the tree",
    "my friend read a good book",
]
PLANTED = {s.rsplit(" ", 1)[0] + " [MASK]": s.rsplit(" ", 1)[1] for s in SENTENCES}
# Not Google's layout on purpose: the special tokens are found by string.
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = sorted({w for s in SENTENCES for w in s.split()} | {".", ",", "he", "she", "it", "was"})
VOCAB = SPECIALS + WORDS
MAX_LENGTH = 32


def run_cli(capsys, *argv):
    """`python -m pipeline ARGV...` in-process: (exit code, stdout, stderr)."""
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def training_data(tokenizer, examples=512, seed=0):
    """[CLS] A [SEP] (B [SEP]) with one word masked; B is the next sentence (cyclic) or another."""
    rng = np.random.default_rng(seed)
    ids = tokenizer.ids(SENTENCES)
    seq = 2 * max(map(len, ids)) + 3
    x = {k: np.zeros((examples, seq), "int32") for k in ("token_ids", "segment_ids", "padding_mask")}
    x["mask_positions"] = np.zeros((examples, 1), "int32")
    y = {"mlm": np.zeros((examples, 1), "int32"), "nsp": np.zeros((examples, 1), "int32")}
    weights = {"mlm": np.ones((examples, 1), "float32"), "nsp": np.ones((examples, 1), "float32")}
    for n in range(examples):
        a = int(rng.integers(len(ids)))
        row = [tokenizer.cls_id, *ids[a], tokenizer.sep_id]
        segments = [0] * len(row)
        if n % 2:  # a pair, half of them in order
            b = (a + 1) % len(ids) if rng.random() < 0.5 else int(rng.integers(len(ids)))
            row += [*ids[b], tokenizer.sep_id]
            segments += [1] * (len(ids[b]) + 1)
            y["nsp"][n] = 0 if b == (a + 1) % len(ids) else 1
        else:  # a single sentence, as fill-mask sees it; no NSP label
            weights["nsp"][n] = 0.0
        # Mask the last word of A half the time (the planted word), else any word.
        position = len(ids[a]) if rng.random() < 0.5 else int(rng.integers(1, len(row)))
        while row[position] == tokenizer.sep_id:
            position -= 1
        y["mlm"][n, 0] = row[position]
        row[position] = tokenizer.mask_id
        x["token_ids"][n, :len(row)] = row
        x["segment_ids"][n, :len(row)] = segments
        x["padding_mask"][n, :len(row)] = 1
        x["mask_positions"][n, 0] = position
    return x, y, weights


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """vocab.txt + a trained tiny pretrainer saved as .keras and as a SavedModel."""
    root = tmp_path_factory.mktemp("inspect")
    vocab = root / "vocab.txt"
    vocab.write_text("\n".join(VOCAB) + "\n", encoding="utf-8")
    tokenizer = tokenizer_lib.Tokenizer(vocab)
    keras.utils.set_random_seed(1)
    # 2 layers: with 1, which pair is in order was learned or not depending on the CPU's
    # rounding (an AMD EPYC tied two B sentences at seeds 1 and 2; 2 layers learn it at 1-3).
    encoder = models.BertEncoder(vocabulary_size=len(VOCAB), num_layers=2, num_heads=2,
                                 hidden_dim=32, intermediate_dim=64, dropout=0.0,
                                 max_sequence_length=MAX_LENGTH)
    model = models.BertPretrainer(encoder)
    model.compile(optimizer=keras.optimizers.Adam(5e-3))
    x, y, weights = training_data(tokenizer)
    model.fit(x, y, sample_weight=weights, batch_size=32, epochs=60, shuffle=False, verbose=0)
    model.save(root / "model.keras")
    model.export(str(root / "saved_model"), format="tf_saved_model", verbose=False)
    return {"root": root, "vocab": vocab, "keras": root / "model.keras",
            "saved_model": root / "saved_model", "tokenizer": tokenizer}


@pytest.fixture(scope="module")
def encoder_model(files):
    """An untrained 2-layer, 2-head pretrainer with dropout 0.1, over the same vocab."""
    keras.utils.set_random_seed(2)
    encoder = models.BertEncoder(vocabulary_size=len(VOCAB), num_layers=2, num_heads=2,
                                 hidden_dim=16, intermediate_dim=32, dropout=0.1,
                                 max_sequence_length=MAX_LENGTH)
    return models.BertPretrainer(encoder)


# --- tokenizer ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_tokenizer_builds_bert_inputs_with_literal_mask(files):
    tokenizer = files["tokenizer"]
    inputs = tokenizer.encode([("The cat sat on the [MASK].", "The dog ran."), ("a bird", None)],
                              MAX_LENGTH)
    assert tokenizer.tokens(inputs["token_ids"][0]) == [
        "[CLS]", "the", "cat", "sat", "on", "the", "[MASK]", ".", "[SEP]", "the", "dog", "ran",
        ".", "[SEP]"]
    assert inputs["segment_ids"][0].tolist() == [0] * 9 + [1] * 5
    assert tokenizer.mask_id == 4 and inputs["token_ids"][0, 6] == 4
    assert inputs["padding_mask"][1].tolist() == [1] * 4 + [0] * 10
    assert inputs["token_ids"][1, 4:].tolist() == [tokenizer.pad_id] * 10


# --- fill-mask and nsp on the model trained here ------------------------------------------------


def test_fill_mask_predicts_the_planted_word(files, capsys):
    model, tokenizer = probes.load(model=files["keras"], vocab=files["vocab"])
    for text, word in PLANTED.items():
        predictions = probes.fill_mask(model, tokenizer, text, top_k=3)
        assert len(predictions) == 1 and len(predictions[0]) == 3
        assert predictions[0][0]["token"] == word, (text, predictions)
        assert predictions[0][0]["probability"] > 0.5
        probabilities = [p["probability"] for p in predictions[0]]
        assert probabilities == sorted(probabilities, reverse=True)
    # The command line, vocab found beside the model, JSON output.
    code, out, err = run_cli(capsys, "fill-mask", "The cat sat on the [MASK].",
                             "--model", files["keras"], "--json", "--top_k", "2")
    assert code == 0, err
    result = json.loads(out)
    assert result["masks"][0]["position"] == 6
    assert result["masks"][0]["predictions"][0]["token"] == "mat"
    code, out, _ = run_cli(capsys, "fill-mask", "the dog ran to the [MASK]", "--model",
                           files["keras"], "--vocab", files["vocab"])
    assert code == 0 and "park" in out.split("rank", 1)[1].splitlines()[1]


def test_saved_model_gives_the_same_predictions(files):
    keras_model, tokenizer = probes.load(model=files["keras"], vocab=files["vocab"])
    saved, _ = probes.load(model=files["saved_model"], vocab=files["vocab"])
    assert saved.kind == "saved_model" and saved.max_sequence_length == MAX_LENGTH
    text = "a bird flew over the [MASK] and [MASK]"
    for a, b in zip(probes.fill_mask(keras_model, tokenizer, text),
                    probes.fill_mask(saved, tokenizer, text)):
        assert [p["token"] for p in a] == [p["token"] for p in b]
        np.testing.assert_allclose([p["probability"] for p in a], [p["probability"] for p in b],
                                   atol=1e-5)
    np.testing.assert_allclose(
        probes.nsp_probability(keras_model, tokenizer, SENTENCES[0], SENTENCES[1]),
        probes.nsp_probability(saved, tokenizer, SENTENCES[0], SENTENCES[1]), atol=1e-5)


def test_nsp_probability_of_the_next_sentence(files, capsys):
    model, tokenizer = probes.load(model=files["keras"], vocab=files["vocab"])
    n = len(SENTENCES)
    scores = probes.nsp_probability(  # all (A, B) pairs in one batch
        model, tokenizer, [a for a in SENTENCES for _ in SENTENCES], SENTENCES * n).reshape(n, n)
    for i, row in enumerate(scores):
        following = (i + 1) % n
        assert int(np.argmax(row)) == following, (SENTENCES[i], np.round(row, 3))
        assert row[following] > 0.5
        assert row[following] == pytest.approx(
            probes.nsp_probability(model, tokenizer, SENTENCES[i], SENTENCES[following]),
            abs=1e-5)
    code, out, err = run_cli(capsys, "nsp", SENTENCES[0], SENTENCES[1],
                             "--model", files["saved_model"], "--json")
    assert code == 0, err
    assert json.loads(out)["is_next_probability"] > 0.5


# --- attention ----------------------------------------------------------------------------------


def test_attention_maps_shape_rows_and_padding(files, encoder_model):
    tokenizer = files["tokenizer"]
    maps = probes.attention_maps(encoder_model, tokenizer, "the cat sat on the mat",
                                 "he was happy")  # checks it reproduces sequence_output
    assert maps.shape == (2, 2, 12, 12)  # (layers, heads, seq, seq)
    np.testing.assert_allclose(maps.sum(axis=-1), 1.0, atol=1e-5)
    np.testing.assert_array_equal(  # inference mode: attention dropout off, same maps twice
        maps, probes.attention_maps(encoder_model, tokenizer, "the cat sat on the mat",
                                    "he was happy"))

    inputs = tokenizer.encode([("the cat sat on the mat", None), ("a bird", None)], MAX_LENGTH)
    hidden, attention = probes.encoder_trace(encoder_model, inputs)
    assert attention.shape == (2, 2, 2, 8, 8)  # (batch, layers, heads, seq, seq)
    short = attention[1]  # "[CLS] a bird [SEP]" + 4 padding positions
    np.testing.assert_allclose(short[..., :4].sum(axis=-1), 1.0, atol=1e-5)
    np.testing.assert_allclose(short[..., 4:], 0.0, atol=1e-7)
    # The layer-by-layer run equals the model, padded rows included.
    expected = encoder_model.backbone(inputs, training=False)["sequence_output"]
    np.testing.assert_allclose(hidden[-1], keras.ops.convert_to_numpy(expected), atol=1e-5)


def test_attention_equals_softmax_of_query_key_products(files, encoder_model):
    """Recomputed from each layer's query/key weights: softmax(QK^T/sqrt(d) + padding mask)."""
    inputs = files["tokenizer"].encode(
        [("the dog ran to the park", "my friend read"), ("the tree", None)], MAX_LENGTH)
    hidden, attention = probes.encoder_trace(encoder_model, inputs)
    for layer, transformer in enumerate(encoder_model.backbone.transformer_layers):
        mha = transformer._self_attention_layer
        wq, bq = (keras.ops.convert_to_numpy(w) for w in (mha._query_dense.kernel,
                                                          mha._query_dense.bias))
        wk, bk = (keras.ops.convert_to_numpy(w) for w in (mha._key_dense.kernel,
                                                          mha._key_dense.bias))
        q = np.einsum("bsh,hnd->bsnd", hidden[layer], wq) + bq  # (batch, seq, heads, head_dim)
        k = np.einsum("bsh,hnd->bsnd", hidden[layer], wk) + bk
        scores = np.einsum("bqnd,bknd->bnqk", q, k) / np.sqrt(q.shape[-1])
        scores = np.where(inputs["padding_mask"][:, None, None, :] == 1, scores, -np.inf)
        weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
        weights /= weights.sum(axis=-1, keepdims=True)
        np.testing.assert_allclose(attention[:, layer], weights, atol=1e-5)


def test_attention_pngs_and_probes(files, encoder_model, tmp_path, capsys):
    tokenizer = files["tokenizer"]
    maps = probes.attention_maps(encoder_model, tokenizer, "the cat sat on the mat")
    tokens = probes.token_labels(tokenizer, "the cat sat on the mat")
    written = plots.plot_attention(maps, tokens, tmp_path / "maps", layers=[1], heads=[0])
    assert [p.name for p in written] == ["layer01_head00.png", "layer01_heads.png"]
    for path in written:
        assert path.stat().st_size > 0
        with Image.open(path) as image:
            assert image.format == "PNG" and min(image.size) > 100
            image.verify()

    written = plots.log_attention_probes(encoder_model, files["vocab"], tmp_path / "probes",
                                         layers=[1])
    assert [p.name for p in written] == [f"probe{i}_layer01_heads.png"
                                         for i in range(len(probes.PROBES))]
    assert all(p.is_file() and p.stat().st_size > 0 for p in written)

    # The command line on the trained 2-layer model; a SavedModel is refused with a reason.
    out_dir = tmp_path / "cli"
    code, out, err = run_cli(capsys, "attention", "the cat sat on the mat", "--model",
                             files["keras"], "--heads", "1", "--out", out_dir)
    assert code == 0, err
    assert sorted(p.name for p in out_dir.glob("*.png")) == [
        "layer00_head01.png", "layer00_heads.png", "layer01_head01.png", "layer01_heads.png"]
    assert np.load(out_dir / "attention.npz")["weights"].shape == (2, 2, 8, 8)
    code, _, err = run_cli(capsys, "attention", "the cat", "--model", files["saved_model"],
                           "--out", out_dir)
    assert code == 2 and "needs the .keras model" in err
    code, _, err = run_cli(capsys, "attention", "the cat", "--model", files["keras"],
                           "--layers", "3", "--out", out_dir)
    assert code == 2 and "0..1" in err


# --- embeddings ---------------------------------------------------------------------------------


def test_embeddings_shapes_and_determinism(files, encoder_model):
    tokenizer = files["tokenizer"]
    texts = ["the cat sat on the mat", "a bird", "the cat sat on the mat"]
    cls = probes.embed(encoder_model, tokenizer, texts, "cls")
    mean = probes.embed(encoder_model, tokenizer, texts, "mean")
    tokens = probes.embed(encoder_model, tokenizer, texts, "tokens")
    assert cls.shape == mean.shape == (3, 16)
    assert [t.shape for t in tokens] == [(8, 16), (4, 16), (8, 16)]
    np.testing.assert_array_equal(cls, probes.embed(encoder_model, tokenizer, texts, "cls"))
    np.testing.assert_allclose(cls[0], cls[2], atol=1e-6)  # identical inputs, identical vectors
    np.testing.assert_allclose(mean[1], tokens[1].mean(axis=0), atol=1e-6)  # padding excluded
    np.testing.assert_allclose(cls[:, None], np.stack([t[:1] for t in tokens]), atol=1e-6)
    one_by_one = probes.embed(encoder_model, tokenizer, texts, "mean", batch_size=1)
    np.testing.assert_allclose(one_by_one, mean, atol=1e-5)  # padding does not change vectors


def test_embed_cli_writes_npy_and_parquet(files, tmp_path, capsys):
    texts = tmp_path / "texts.txt"
    texts.write_text("the cat sat on the mat\n\na bird flew\n", encoding="utf-8")
    code, out, err = run_cli(capsys, "embed", "--input", texts, "--model", files["keras"],
                             "--pooling", "mean", "--out", tmp_path / "mean.npy")
    assert code == 0, err
    assert np.load(tmp_path / "mean.npy").shape == (2, 32)
    code, out, err = run_cli(capsys, "embed", "my friend", "--input", texts, "--model",
                             files["keras"], "--pooling", "tokens",
                             "--out", tmp_path / "tokens.parquet")
    assert code == 0, err
    table = pq.read_table(tmp_path / "tokens.parquet").to_pylist()
    assert [row["text"] for row in table] == ["my friend", "the cat sat on the mat", "a bird flew"]
    assert table[0]["tokens"] == ["[CLS]", "my", "friend", "[SEP]"]
    assert [len(row["embedding"]) for row in table] == [4, 8, 5]
    assert len(table[0]["embedding"][0]) == 32
    code, _, _ = run_cli(capsys, "embed", "a b", "--model", files["keras"], "--pooling", "cls",
                         "--out", tmp_path / "cls.parquet")
    assert code == 0
    assert len(pq.read_table(tmp_path / "cls.parquet").to_pylist()[0]["embedding"]) == 32


# --- bad input ----------------------------------------------------------------------------------


def test_bad_input_exits_2_with_a_message(files, tmp_path, capsys):
    model = ("--model", files["keras"])
    code, _, err = run_cli(capsys, "fill-mask", "the cat sat on the mat", *model)
    assert code == 2 and "no [MASK]" in err
    code, _, err = run_cli(capsys, "fill-mask", "the cat [MASK] " + "on the mat " * 12, *model)
    assert code == 2 and f"at most {MAX_LENGTH}" in err
    code, _, err = run_cli(capsys, "nsp", "the cat " * 10, "the dog " * 10, *model)
    assert code == 2 and f"at most {MAX_LENGTH}" in err
    code, _, err = run_cli(capsys, "fill-mask", "the [MASK]", "--model", tmp_path / "nope.keras")
    assert code == 2 and "not found" in err
    code, _, err = run_cli(capsys, "fill-mask", "the [MASK]", "--run_dir", tmp_path / "no_run")
    assert code == 2 and "no trained model" in err
    code, _, err = run_cli(capsys, "fill-mask", "the [MASK]", *model,
                           "--vocab", tmp_path / "missing.txt")
    assert code == 2 and "vocab file" in err and "not found" in err
    code, _, err = run_cli(capsys, "embed", "the cat " * 20, *model, "--out", tmp_path / "x.npy")
    assert code == 2 and "--truncate" in err
    code, _, err = run_cli(capsys, "embed", "the cat", *model, "--out", tmp_path / "x.csv")
    assert code == 2 and ".npy or .parquet" in err
    code, _, _ = run_cli(capsys, "fill-mask", *model)  # argparse: missing TEXT
    assert code == 2

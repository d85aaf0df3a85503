"""Bad inputs of continued pretraining (issue 48, point 8): a domain corpus in another language
than the checkpoint's vocab (most pieces [UNK]) gets a one-line warning naming the file and the
[UNK] share; a corpus too small for one batch is refused in one line (exit 2) naming the corpus
and what to do.
"""

from __future__ import annotations

import random

import pytest

from pipeline import artifacts, cli
from pipeline.stages import pretrain
from pipeline.text import coverage
from pipeline.training.pretrainer import PretrainError

from tests.conftest import make_corpus
from tests.test_init_from import tiny_vocab
from tests.test_training import no_export, tiny_config, write_pretraining_data

GREEK = ("η γάτα ο σκύλος το σπίτι το δέντρο ο ποταμός ο λόφος ο δρόμος γρήγορα αργά είδε "
         "άκουσε βρήκε παλιό νέο χαρούμενο λυπημένο κήπος παράθυρο πρωί βράδυ").split()


def write_greek(path, documents=6, seed=0):
    rng = random.Random(seed)
    docs = ["\n".join(" ".join(rng.choice(GREEK) for _ in range(8)).capitalize() + "."
                      for _ in range(4)) for _ in range(documents)]
    path.write_text("\n\n".join(docs) + "\n", encoding="utf-8")


def test_a_corpus_in_another_language_than_the_vocab_is_warned_about(tmp_path, capsys):
    corpus = tmp_path / "raw"
    make_corpus(corpus, documents=12)  # English: part-0.txt, part-1.txt
    write_greek(corpus / "greek.txt")
    vocab = tmp_path / "checkpoint" / "vocab.txt"
    vocab.parent.mkdir()
    vocab.write_text("\n".join(tiny_vocab(False)) + "\n", encoding="utf-8")
    args = [f"run_dir={tmp_path / 'run'}", f"corpus.path={corpus}/*.txt",
            f"vocab.from_file={vocab}", f"tracking.tracking_uri=sqlite:///{tmp_path}/mlflow.db",
            "tracking.experiment=unk"]
    assert cli.main(["corpus", "--config", "configs/test_tiny.yaml", *args]) == 0
    capsys.readouterr()
    assert cli.main(["vocab", "--config", "configs/test_tiny.yaml", *args]) == 0
    said = capsys.readouterr()
    # One warning on the console (which may shorten a long path), for the Greek file only;
    # the stage's log has it whole.
    warned = [line for line in (said.out + said.err).splitlines()
              if line.startswith("warning: vocab:") and "[UNK]" in line]
    assert len(warned) == 1 and "greek" in warned[0], warned
    lines = [line for line in (tmp_path / "run" / "logs" / "vocab.log").read_text().splitlines()
             if "[UNK]" in line]
    assert len(lines) == 1 and str(corpus / "greek.txt") in lines[0], lines
    share = float(lines[0].split("% of the WordPiece pieces")[0].split()[-1])
    assert share > 50  # its words are [UNK]; only the full stops are not
    assert "another language" in lines[0] and "model.init_from" in lines[0]
    # The English files are covered by the vocab: below the threshold.
    shares = coverage.input_shares(vocab, True, sorted(corpus.glob("part-*.txt")))
    assert shares and all(share <= coverage.WARN_SHARE for share, _ in shares.values())


def test_a_corpus_smaller_than_one_batch_is_refused_in_one_line(tmp_path, monkeypatch):
    no_export(monkeypatch)
    run = tmp_path / "run"
    write_pretraining_data(run, train_files=1, records_per_file=5)
    corpus = tmp_path / "tiny-domain" / "*.txt"
    config = tiny_config(run, "corpus.source=files", f"corpus.path={corpus}")
    with pytest.raises(PretrainError) as err:
        pretrain.run(config)
    message = str(err.value)
    assert "\n" not in message
    assert f"the corpus {corpus} makes 5 training instance(s)" in message
    assert "train.batch_size = 8" in message and "give more text (corpus.path)" in message
    assert "lower train.batch_size to at most 5" in message
    assert cli._is_user_error(err.value)  # exit 2, one line, no traceback
    assert not artifacts.Artifacts(run).checkpoint_dir.exists()  # refused before training
    # One batch's worth is enough.
    enough = tmp_path / "enough"
    write_pretraining_data(enough, train_files=1, records_per_file=8)
    assert pretrain.run(tiny_config(enough, "train.steps=1", "train.warmup_steps=0"))["step"] == 1

"""What adapting costs (issue 48, point 3): `train.general_heldout` scores general text beside
the domain's with every held-out probe; the summary says the accuracy before adapting (step 0,
or the end of the head warm-up when the heads were new), at the end, and the points lost.

Real parts: the pretrain stage's own training (`pretrain.run`) of a tiny encoder-only
checkpoint written by our exporter (tests/test_head_warmup.py), general text tokenized with
the run's vocab and masked by the data job's own functions.
"""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from pipeline import artifacts, cli
from pipeline.training import general_text, head_warmup

from tests.test_head_warmup import encoder_only, train, vocab  # noqa: F401 (fixtures)
from tests.test_training import no_export, tiny_config, write_pretraining_data


def write_general(folder, documents=12, seed=0):
    """Raw text over the test vocab's words (w0 ... w199), documents between blank lines."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    docs = ["\n".join(" ".join(f"w{i}" for i in rng.integers(0, 200, 12)) + "."
                      for _ in range(5)) for _ in range(documents)]
    (folder / "general.txt").write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    return folder


def test_summary_before_is_step_0_or_the_unfreeze_step():
    curve = [(0, 0.01), (3, 0.40), (6, 0.35)]
    assert general_text.summary(curve, None) == {
        "before_step": 0, "before": 0.01, "after_step": 6, "after": 0.35, "forgetting": -34.0}
    assert general_text.summary(curve, 3) == {
        "before_step": 3, "before": 0.40, "after_step": 6, "after": 0.35, "forgetting": 5.0}
    assert general_text.summary([], 3) == {}


def test_the_sample_is_the_same_every_time_and_masked_as_the_data_job_masks(tmp_path):
    run = tmp_path / "run"
    write_pretraining_data(run)
    general = write_general(tmp_path / "general")
    config = tiny_config(run, f"train.general_heldout={general}/*.txt", "train.batch_size=4",
                         "train.heldout_batches=2")
    paths = artifacts.Artifacts(run)
    first = general_text.for_run(config, paths)
    again = general_text.for_run(config, paths)
    assert len(first) == 2
    for (x, y, w), (x2, _, _) in zip(first, again):
        assert np.array_equal(x["token_ids"], x2["token_ids"])
        ids = np.asarray(x["token_ids"])
        assert ids.shape[0] == 4 and (ids[:, 0] == 101).all()  # [CLS] first
        real = np.asarray(w["mlm"]) > 0
        assert real.any(axis=1).all()  # every sequence has masked positions
        positions = np.asarray(x["mask_positions"])
        # The labels are text pieces (words, or [UNK] for the full stop), never [PAD], [CLS],
        # [SEP] or [MASK]; at most 15% of the pieces are chosen.
        assert not np.isin(np.asarray(y["mlm"])[real], [0, 101, 102, 103]).any()
        assert real.sum(axis=1).max() <= max(1, round(ids.shape[1] * 0.15))
        assert (positions[real] > 0).all()


def test_a_general_text_that_matches_nothing_is_one_line(tmp_path):
    run = tmp_path / "run"
    write_pretraining_data(run)
    config = tiny_config(run, f"train.general_heldout={tmp_path}/nothing/*.txt")
    with pytest.raises(general_text.GeneralTextError) as err:
        general_text.for_run(config, artifacts.Artifacts(run))
    message = str(err.value)
    assert "\n" not in message and "train.general_heldout" in message and "matches no file" in message
    assert cli._is_user_error(err.value)
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "a.txt").write_text("\n\n", encoding="utf-8")
    with pytest.raises(general_text.GeneralTextError, match="hold no text"):
        general_text.for_run(tiny_config(run, f"train.general_heldout={empty}/*.txt"),
                             artifacts.Artifacts(run))
    # The demo corpus as the general text of a run on the demo corpus: no second probe.
    same = tiny_config(run, "train.general_heldout=brown", "corpus.source=brown")
    assert general_text.for_run(same, artifacts.Artifacts(run)) is None


@pytest.mark.slow
def test_continued_pretraining_logs_the_general_curve_and_what_it_lost(
        tmp_path, monkeypatch, caplog, encoder_only):  # noqa: F811
    no_export(monkeypatch)
    caplog.set_level(logging.INFO, logger="pipeline")
    general = write_general(tmp_path / "general")
    result = train(tmp_path / "run", encoder_only, "train.steps=6", "train.checkpoint_every=6",
                   "train.head_warmup_steps=3", "train.warmup_steps=1", "train.heldout_every=2",
                   "train.heldout_batches=1", f"train.general_heldout={general}/*.txt")
    paths = artifacts.Artifacts(tmp_path / "run")
    heldout = json.loads(paths.heldout_curve.read_text())
    said = heldout["general"]
    # Probed with the domain's held-out text, at the same steps.
    assert [step for step, _ in said["curve"]] == [step for step, _, _ in heldout["curve"]]
    # Every 2 updates, and at the unfreeze (step 3: the new head on the encoder as published).
    assert [step for step, _ in said["curve"]] == [0, 2, 3, 4, 6] and result["step"] == 6
    record = head_warmup.read_record(paths.checkpoint_dir)
    assert record.unfrozen_at == 3 and said["before_step"] == 3
    at = dict(map(tuple, said["curve"]))
    assert said["before"] == at[said["before_step"]] and said["after"] == at[6]
    assert said["forgetting"] == round(100 * (said["before"] - said["after"]), 2)
    line = next(m for m in caplog.messages if "general text" in m and "points" in m)
    assert f"{said['before']:.4f} at step {said['before_step']}" in line
    assert f"-> {said['after']:.4f} at step 6" in line

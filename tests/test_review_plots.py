"""The training-curves figure every pretraining run draws: labelled axes, the held-out probes,
and no legend entry for a loss that was not trained."""

import math

from pipeline.training.review import curves_figure

HISTORY = [(step, {"loss": 9.0 - step / 100, "mlm_loss": 9.0 - step / 100,
                   "nsp_loss": 0.69, "mlm_accuracy": step / 1000, "nsp_accuracy": float("nan")})
           for step in (100, 200, 300)]
HELDOUT = [(100, 10.0, 0.05), (300, 30.0, 0.2)]


def _panels(figure):
    loss, accuracy = figure.axes
    return loss, accuracy


def _labels(axes):
    return axes.get_legend_handles_labels()[1]


def test_axes_are_labelled_and_the_held_out_probes_are_drawn():
    figure = curves_figure(HISTORY, HELDOUT, title="run x")
    loss, accuracy = _panels(figure)
    assert loss.get_xlabel() == accuracy.get_xlabel() == "update step"
    assert "nats" in loss.get_ylabel() and accuracy.get_ylabel() == "accuracy"
    assert "mlm_accuracy (held-out)" in _labels(accuracy)
    held = [line for line in accuracy.get_lines() if line.get_label() == "mlm_accuracy (held-out)"]
    assert list(held[0].get_xdata()) == [100, 300] and list(held[0].get_ydata()) == [0.05, 0.2]
    assert figure._suptitle.get_text() == "run x"


def test_an_untrained_sentence_loss_and_an_unlogged_metric_get_no_line():
    trained = _labels(_panels(curves_figure(HISTORY))[0])
    assert "nsp_loss (training)" in trained
    loss, accuracy = _panels(curves_figure(HISTORY, sentence_loss=False))
    assert "nsp_loss (training)" not in _labels(loss)
    # nsp_accuracy is NaN at every step: no entry; the MLM loss equal to the loss: one line.
    assert _labels(accuracy) == ["mlm_accuracy (training)"]
    assert _labels(loss) == ["loss (training)"]
    assert all(not math.isnan(y) for line in loss.get_lines() for y in line.get_ydata())


def test_a_separate_mlm_loss_gets_its_own_line():
    history = [(s, dict(m, loss=m["mlm_loss"] + 0.7)) for s, m in HISTORY]
    assert "mlm_loss (training)" in _labels(_panels(curves_figure(history))[0])

"""Images for reviewers in the MLflow UI: the training curves and the attention maps of a few
fixed probe sentences.
"""

from __future__ import annotations

import json
import logging

from pipeline.artifacts import Artifacts
from pipeline.config import Config
from pipeline.tracking import outbox

log = logging.getLogger(__name__)


def curves_figure(history: list, heldout: list | None = None, title: str = "",
                  sentence_loss: bool = True):
    """The training curves as a Matplotlib figure (no pyplot state): loss in nats and accuracy
    against the update step (training figures: Keras' mean over the batches since the last
    checkpoint, so they step down where one was written), the held-out probes' MLM accuracy (`heldout`: (step, seconds,
    accuracy) rows) beside the training accuracy. A metric the run did not log (NaN at every
    step) gets no legend entry; `sentence_loss=False` (train.nsp_weight 0: computed, not
    trained) leaves out the NSP/SOP loss and accuracy."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(9, 3.6), dpi=100)
    FigureCanvasAgg(figure)
    steps = [step for step, _ in history]
    panels = ((("loss", "mlm_loss", "nsp_loss"), "training loss (cross-entropy, nats)"),
              (("mlm_accuracy", "nsp_accuracy"), "accuracy"))
    for index, (keys, ylabel) in enumerate(panels):
        axes = figure.add_subplot(1, 2, index + 1)
        for key in keys:
            if key.startswith("nsp") and not sentence_loss:
                continue
            values = [float(m.get(key, float("nan"))) for _, m in history]
            if key == "mlm_loss" and values == [float(m.get("loss", "nan")) for _, m in history]:
                continue  # the MLM loss is the whole loss: one line
            if any(value == value for value in values):  # not all NaN
                # Keras' running mean over the training batches since the last checkpoint (an epoch of fit).
                axes.plot(steps, values, label=f"{key} (training)")
        if index == 1 and heldout:
            axes.plot([row[0] for row in heldout], [row[2] for row in heldout], "o-",
                      markersize=3, label="mlm_accuracy (held-out)")
        axes.set_xlabel("update step")
        axes.set_ylabel(ylabel)
        axes.grid(alpha=0.3)
        if axes.get_legend_handles_labels()[0]:
            axes.legend(fontsize=8)
    if title:
        figure.suptitle(title, fontsize=9)
    figure.tight_layout()
    return figure


def review_plots(model, config: Config, paths: Artifacts, history: list) -> None:
    """Images for reviewers in the MLflow UI: the loss curves of this run and (with
    tracking.attention_maps) attention maps of a few fixed probe sentences. A plotting failure is reported, never fatal to a finished run."""
    try:
        if history:
            heldout = None
            if paths.heldout_curve.is_file():
                heldout = json.loads(paths.heldout_curve.read_text()).get("curve")
            start = config.model.init_from or f"BERT-{config.model.preset}, random weights"
            title = (f"run {paths.root.name}: {start}, batch {config.train.batch_size}, "
                     f"seq {config.data.max_seq_length}")
            figure = curves_figure(history, heldout, title,
                                   sentence_loss=config.train.nsp_weight > 0)
            curves = paths.pretrain_dir / "training_curves.png"
            figure.savefig(curves)
            outbox.log_artifact(curves, "plots")
        if not config.tracking.attention_maps:
            return
        from pipeline.inspection import plots

        out_dir = paths.pretrain_dir / "attention"
        plots.log_attention_probes(model, paths.vocab_file, out_dir,
                                   lowercase=config.vocab.lowercase)
        outbox.log_artifact(out_dir, "plots/attention")
    except Exception as err:  # noqa: BLE001 - the model is already saved; plots are extras
        log.info(f"pretrain: could not draw the review plots: {err!r}")

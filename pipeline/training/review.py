"""Images for reviewers in the MLflow UI: the training curves and the attention maps of a few
fixed probe sentences.
"""

from __future__ import annotations

import logging

from pipeline.artifacts import Artifacts
from pipeline.config import Config
from pipeline.tracking import outbox

log = logging.getLogger(__name__)


def review_plots(model, config: Config, paths: Artifacts, history: list) -> None:
    """Images for reviewers in the MLflow UI: the loss curves of this run and attention maps of
    a few fixed probe sentences. A plotting failure is reported, never fatal to a finished run."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        if history:
            figure = Figure(figsize=(9, 3.5))
            FigureCanvasAgg(figure)
            steps = [step for step, _ in history]
            for index, keys in enumerate((("loss", "mlm_loss", "nsp_loss"),
                                          ("mlm_accuracy", "nsp_accuracy"))):
                axes = figure.add_subplot(1, 2, index + 1)
                for key in keys:
                    axes.plot(steps, [m.get(key, float("nan")) for _, m in history], label=key)
                axes.set_xlabel("step")
                axes.legend()
            figure.tight_layout()
            curves = paths.pretrain_dir / "training_curves.png"
            figure.savefig(curves)
            outbox.log_artifact(curves, "plots")
        from pipeline.inspection import plots

        out_dir = paths.pretrain_dir / "attention"
        plots.log_attention_probes(model, paths.vocab_file, out_dir,
                                   lowercase=config.vocab.lowercase)
        outbox.log_artifact(out_dir, "plots/attention")
    except Exception as err:  # noqa: BLE001 - the model is already saved; plots are extras
        log.info(f"pretrain: could not draw the review plots: {err!r}")

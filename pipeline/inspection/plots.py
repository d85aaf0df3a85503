"""Attention heat maps as PNG files, and the probe sentences' maps the pretrain stage logs."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

import numpy as np

from pipeline.inspection.probes import PROBES, as_model, attention_maps, token_labels
from pipeline.text.tokenizer import Tokenizer
from pipeline.text.vocab import TextError


def _figure(width: float, height: float):
    # Object-oriented Matplotlib with the Agg canvas: no pyplot, no global backend state.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(figure)
    return figure


def _heat_map(figure, box, weights: np.ndarray, tokens: list[str], title: str, fontsize: float):
    """One head's map in `box` = (left, bottom, side, side) inches; rows = queries, columns = keys."""
    width, height = figure.get_size_inches()
    left, bottom, side_w, side_h = box
    ax = figure.add_axes((left / width, bottom / height, side_w / width, side_h / height))
    image = ax.imshow(weights, cmap="viridis", vmin=0.0, interpolation="nearest", aspect="auto")
    ticks = np.arange(len(tokens))
    ax.set_xticks(ticks, tokens, rotation=90, fontsize=fontsize)
    ax.set_yticks(ticks, tokens, fontsize=fontsize)
    ax.set_xlabel("key (attended to)", fontsize=8)
    ax.set_ylabel("query", fontsize=8)
    ax.set_title(title, fontsize=9)
    return ax, image


def plot_attention(maps: np.ndarray, tokens: list[str], out_dir: str | Path,
                   layers: Sequence[int] | None = None, heads: Sequence[int] | None = None,
                   per_head: bool = True, prefix: str = "") -> list[Path]:
    """Writes heat maps of `maps` `(layers, heads, seq, seq)` as PNGs; returns their paths.

    Per chosen layer: `{prefix}layer{L:02d}_head{H:02d}.png` for each chosen head
    (if `per_head`) and `{prefix}layer{L:02d}_heads.png`, a grid of all its heads.
    """
    num_layers, num_heads, seq, _ = maps.shape
    layers = list(range(num_layers)) if layers is None else list(layers)
    heads = list(range(num_heads)) if heads is None else list(heads)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    # Fixed geometry in inches instead of a layout engine: text layout is most of the
    # cost of a figure, and tight/constrained layout would draw every figure twice.
    side = min(max(2.2, 0.2 * seq), 12.0)  # the square map
    fontsize = max(3.0, min(9.0, 0.75 * 72 * side / seq))
    margin = 0.35 + max(len(t) for t in tokens) * fontsize * 0.62 / 72  # tick labels + axis label
    written = []
    for layer in layers:
        if per_head:
            for head in heads:
                figure = _figure(margin + side + 1.0, margin + side + 0.45)
                _, image = _heat_map(figure, (margin, margin, side, side), maps[layer, head],
                                     tokens, f"layer {layer}, head {head}", fontsize)
                width, height = figure.get_size_inches()
                colorbar = figure.add_axes(((margin + side + 0.15) / width, margin / height,
                                            0.15 / width, side / height))
                figure.colorbar(image, cax=colorbar)
                path = out_dir / f"{prefix}layer{layer:02d}_head{head:02d}.png"
                figure.savefig(path)
                written.append(path)
        grid_side = min(side, 6.0)
        grid_font = max(3.0, min(9.0, 0.75 * 72 * grid_side / seq))
        grid_margin = 0.35 + max(len(t) for t in tokens) * grid_font * 0.62 / 72
        columns = min(num_heads, 4)
        rows = math.ceil(num_heads / columns)
        cell_w, cell_h = grid_margin + grid_side + 0.2, grid_margin + grid_side + 0.4
        figure = _figure(columns * cell_w, rows * cell_h + 0.4)
        for head in range(num_heads):
            row, column = divmod(head, columns)
            box = (column * cell_w + grid_margin, (rows - 1 - row) * cell_h + grid_margin,
                   grid_side, grid_side)
            _heat_map(figure, box, maps[layer, head], tokens, f"head {head}", grid_font)
        figure.suptitle(f"layer {layer}: attention of every head (rows: queries, columns: keys)",
                        y=1 - 0.15 / (rows * cell_h + 0.4), va="top", fontsize=10)
        path = out_dir / f"{prefix}layer{layer:02d}_heads.png"
        figure.savefig(path)
        written.append(path)
    return written


def log_attention_probes(model, vocab: Tokenizer | str | Path, out_dir: str | Path,
                         sentences: Sequence = PROBES, *, lowercase: bool | None = None,
                         layers: Sequence[int] | None = None) -> list[Path]:
    """Attention grids (one PNG per layer, all heads) for a few fixed probe sentences.

    `vocab` is a `Tokenizer` or a vocab.txt path (`lowercase=None`: from the
    vocab.json beside it). Each of `sentences` is a text or an (A, B) pair; ones
    longer than the model takes are skipped. Files: `probe{i}_layer{L:02d}_heads.png`.
    Returns the paths written (for `mlflow.log_artifact`).
    """
    tokenizer = vocab if isinstance(vocab, Tokenizer) else Tokenizer.from_vocab(vocab, lowercase)
    model = as_model(model)
    written = []
    for i, probe in enumerate(sentences):
        text, text_b = (probe, None) if isinstance(probe, str) else probe
        try:
            maps = attention_maps(model, tokenizer, text, text_b)
        except TextError:  # a probe longer than the model's positions
            continue
        tokens = token_labels(tokenizer, text, text_b)
        written += plot_attention(maps, tokens, out_dir, layers=layers, per_head=False,
                                  prefix=f"probe{i}_")
    return written

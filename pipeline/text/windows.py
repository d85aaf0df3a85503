"""Sliding windows over a sequence of word pieces: one function for every long-text task.

`spans(n, window, stride)` is the doc-stride rule of Google's `run_squad.py`: windows of at
most `window` pieces starting at 0, `stride`, `2·stride`, ... until one reaches the end, so
every piece is in at least one window and consecutive windows overlap by
`window - stride` pieces (when `stride < window`). It is used by

- extractive QA (`pipeline/finetuning/features.py` `qa_features`: context windows after the question),
- long-document classification (`document_windows` below: `[CLS] window [SEP]` per window,
  the window predictions aggregated per document by the head, `finetune.long_doc_aggregation`),
- passage retrieval (`pipeline/serving/search.py`: a long document split into passages, each
  embedded, document score = best passage score).

    >>> spans(10, 4, 3)
    [(0, 4), (3, 4), (6, 4)]
    >>> spans(3, 4, 2)
    [(0, 3)]
    >>> spans(0, 4, 2)
    [(0, 0)]
"""

from __future__ import annotations

import numpy as np

# The inputs of a windowed model (models/window_heads.py), each (texts, windows[, seq]).
WINDOW_FEATURES = ("token_ids", "segment_ids", "padding_mask", "window_mask")


def spans(n_tokens: int, window: int, stride: int, max_windows: int = 0) -> list[tuple[int, int]]:
    """(start, length) of each window over `n_tokens` pieces (see the module docstring).

    A stride larger than the window is clamped to the window (no piece is skipped). An empty
    sequence has one empty window. `max_windows` > 0 keeps only the first that many windows
    (the tail beyond them is then not covered; `document_windows` counts such documents).
    """
    if window < 1:
        raise ValueError(f"window = {window}: a window must hold at least one piece")
    if stride < 1:
        raise ValueError(f"stride = {stride}: the stride must be at least one piece")
    out, start = [], 0
    while True:
        length = min(n_tokens - start, window)
        out.append((start, length))
        if start + length >= n_tokens:
            break
        start += min(length, stride)
    return out[:max_windows] if max_windows > 0 else out


def is_max_context(windows: list[tuple[int, int]], position: int, window_index: int) -> bool:
    """BERT's _check_is_max_context: is `window_index` the window with the most context (on
    the shorter side) around piece `position`? Ties go to the earlier window."""
    best, best_index = None, None
    for w, (start, length) in enumerate(windows):
        end = start + length - 1
        if position < start or position > end:
            continue
        score = min(position - start, end - position) + 0.01 * length
        if best is None or score > best:
            best, best_index = score, w
    return best_index == window_index


def document_windows(piece_ids: list[list[int]], seq_length: int, stride: int, max_windows: int,
                     cls_id: int, sep_id: int, pad_id: int) -> dict:
    """Per document, `[CLS] window [SEP]` rows for every window of its pieces.

    Windows hold `seq_length - 2` pieces and start every `stride` pieces (`spans`). Returns
    numpy arrays token_ids, segment_ids, padding_mask of shape (docs, max_windows, seq_length)
    and window_mask (docs, max_windows): 1 for a real window; the unused rows hold
    `[CLS] [SEP]` (a valid input, masked out of the aggregation). Also "n_windows" (per
    document) and "truncated_documents" (documents with more windows than `max_windows`,
    whose tail is cut).
    """
    room = seq_length - 2
    if room < 1:
        raise ValueError(f"seq_length = {seq_length} leaves no room for a window")
    n = len(piece_ids)
    token_ids = np.full((n, max_windows, seq_length), pad_id, np.int32)
    token_ids[:, :, 0], token_ids[:, :, 1] = cls_id, sep_id
    window_mask = np.zeros((n, max_windows), np.int32)
    counts, truncated = [], 0
    for i, ids in enumerate(piece_ids):
        every = spans(len(ids), room, stride)
        truncated += len(every) > max_windows
        kept = every[:max_windows]
        counts.append(len(kept))
        for w, (start, length) in enumerate(kept):
            row = [cls_id] + list(ids[start:start + length]) + [sep_id]
            token_ids[i, w, :] = pad_id
            token_ids[i, w, :len(row)] = row
            window_mask[i, w] = 1
    return {"token_ids": token_ids, "segment_ids": np.zeros_like(token_ids),
            "padding_mask": (token_ids != pad_id).astype(np.int32), "window_mask": window_mask,
            "n_windows": np.asarray(counts, np.int32), "truncated_documents": int(truncated)}


def text_windows(texts: list[str], pre, stride: int, max_windows: int) -> dict:
    """`document_windows` for raw texts with a `models.preprocessor.TextPreprocessor` (the whole text
    tokenized by its in-graph WordPiece tokenizer, so the first window is exactly what the
    truncating single-window model sees)."""
    return document_windows(pre.tokenize_words(list(texts)), pre.seq_length, stride, max_windows,
                            pre.cls_id, pre.sep_id, pre.pad_id)


# ---------------------------------------------------------------------------
# The same windows in TensorFlow ops (inside the raw-text SavedModel)
# ---------------------------------------------------------------------------
def tf_text_windows(pre, text, stride: int, max_windows: int) -> dict:
    """`text_windows` in graph ops: string tensor (batch,) -> the four window inputs.

    Same rule as `spans` for stride <= window (the config guarantees it): window k starts at
    k·stride, holds min(n - k·stride, window) pieces, and there are
    1 + ceil(max(n - window, 0) / stride) windows (at most `max_windows`).
    """
    import tensorflow as tf

    seq, room = pre.seq_length, pre.seq_length - 2
    pieces = tf.cast(pre.tokenizer(text), tf.int32)  # ragged (batch, pieces)
    n = tf.cast(pieces.row_lengths(), tf.int32)  # (batch,)
    width = max_windows * stride + room  # every index a kept window can reach
    dense = pieces.to_tensor(default_value=pre.pad_id)
    dense = tf.pad(dense, [[0, 0], [0, tf.maximum(width - tf.shape(dense)[1], 0)]],
                   constant_values=pre.pad_id)[:, :width]
    count = 1 + (tf.maximum(n - room, 0) + stride - 1) // stride
    count = tf.minimum(count, max_windows)  # (batch,)
    starts = tf.range(max_windows, dtype=tf.int32) * stride  # (W,)
    lengths = tf.clip_by_value(n[:, None] - starts[None, :], 0, room)  # (batch, W)
    real = tf.range(max_windows)[None, :] < count[:, None]  # (batch, W)
    lengths = tf.where(real, lengths, 0)
    index = starts[:, None] + tf.range(room, dtype=tf.int32)[None, :]  # (W, room)
    batch = tf.shape(dense)[0]
    gathered = tf.gather(dense, tf.broadcast_to(index, [batch, max_windows, room]),
                         batch_dims=1)  # (batch, W, room)
    inside = tf.range(room)[None, None, :] < lengths[:, :, None]
    body = tf.where(inside, gathered, pre.pad_id)
    cls = tf.fill([batch, max_windows, 1], pre.cls_id)
    row = tf.concat([cls, body, tf.fill([batch, max_windows, 1], pre.pad_id)], axis=-1)
    sep_at = tf.range(seq)[None, None, :] == (lengths + 1)[:, :, None]
    token_ids = tf.where(sep_at, pre.sep_id, row)  # (batch, W, seq)
    return {"token_ids": token_ids, "segment_ids": tf.zeros_like(token_ids),
            "padding_mask": tf.cast(token_ids != pre.pad_id, tf.int32),
            "window_mask": tf.cast(real, tf.int32)}

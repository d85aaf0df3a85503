"""Raw-string serving graphs for token classification (NER, POS) and extractive QA (SQuAD).

These do in TensorFlow ops what `pipeline.finetuning.features.token_features` / `token_predictions` and
`qa_features` / `qa_predictions` do in Python, so the SavedModel written by
`pipeline.serving.export.export_text_model` takes raw strings, like the classification one:

token classification: `text` (batch,) ->
    words       (batch, max_words) string, "" past word_count: the text split on whitespace
    labels      (batch, max_words) string: the label of each word's first word piece; a word
                 cut by max_seq_length gets the fallback label ("O" if a label, else the first)
    scores      (batch, max_words) float32: the softmax probability of that label (0 if cut)
    word_count  (batch,) int32
  Words are whitespace-separated (Python's `str.split()`: the same Unicode whitespace). The
  training data are pre-split words (CoNLL columns, Brown tokens), so a text to tag should be
  tokenized the same way ("The cat , sat ." - punctuation as its own word); each word is then
  word-pieced exactly as in training (the WordPiece tokenizer also splits on punctuation inside a
  word: all of a word's pieces stay under that word, the label comes from the first).

extractive QA: `question`, `context` (batch,) ->
    answer       (batch,) string: the answer span of the context ("" for none / SQuAD v2 null)
    score        (batch,) float32: its start + end logit (-inf when no span qualified)
    null_score   (batch,) float32: the min over windows of the [CLS] start + end logit
    start, end   (batch,) int32: the answer's character offsets in the context (-1 if "")
  The context is split into words and single punctuation/CJK characters (`basic_tokens`, the
  tokenizer contract's split, as RE2 classes), word-pieced, and cut into windows of
  `max_seq_length - question pieces - 3` pieces every `doc_stride` pieces (BERT's doc stride),
  all windows in one model call; BERT's n-best search (top `n_best` starts and ends, end >= start,
  at most `max_answer_length` pieces, the start in its maximum-context window) picks the span.
  Long contexts are therefore served whole, like in evaluation; the cost is one model row per
  window.
"""

from __future__ import annotations

# Python's `\s` (str.isspace, what `str.split()` splits word-tagging input on) as an RE2 class
# (identical for every assigned code point of the Unicode version Python 3.11 knows).
WHITESPACE = r"[\s\x{0b}\x{1c}-\x{1f}\x{85}\p{Z}]"


def _pieces_or_unk(tokenizer, strings, unk_id):
    """Word-piece ids (ragged (n, pieces), int32) of each string; [UNK] for one with none, as
    `token_features` / `qa_features` do (`pieces or [unk_id]`)."""
    import tensorflow as tf

    pieces = tokenizer(strings)
    pieces = tf.cast(pieces, tf.int32) if pieces.dtype != tf.int32 else pieces
    return _nonempty(pieces, unk_id)


def _nonempty(ragged, fill):
    """Rows of a 2-D ragged tensor with an empty row replaced by [fill]."""
    import tensorflow as tf

    n = ragged.nrows()
    extra = tf.RaggedTensor.from_tensor(tf.fill(tf.stack([n, 1]), tf.cast(fill, ragged.dtype)))
    padded = tf.concat([ragged, extra], axis=1)
    keep = tf.maximum(ragged.row_lengths(), 1)
    index = tf.ragged.range(padded.row_lengths())
    return tf.ragged.boolean_mask(padded, index < tf.expand_dims(keep, 1))


def _first_index(mask, axis):
    """The first index along `axis` where `mask` is true (the size of the axis if none)."""
    import tensorflow as tf

    size = tf.shape(mask, out_type=tf.int64)[axis]
    shape = [1] * len(mask.shape)
    shape[axis] = -1
    index = tf.reshape(tf.range(size), shape)
    return tf.reduce_min(tf.where(mask, index, size), axis=axis)


# ---------------------------------------------------------------------------
# Token classification
# ---------------------------------------------------------------------------
def build_token_module(model, preprocessor, labels):
    """A tf.Module whose `serve(text)` tags whitespace-separated words (module docstring)."""
    import tensorflow as tf
    import tensorflow_text as tf_text

    seq = preprocessor.seq_length
    labels = [str(x) for x in labels]
    fallback = "O" if "O" in labels else labels[0]
    cls_id, sep_id = preprocessor.cls_id, preprocessor.sep_id
    pad_id, unk_id = preprocessor.pad_id, preprocessor.unk_id

    class TokenServing(tf.Module):
        def __init__(self):
            super().__init__(name="token_serving")
            self.model = model
            self.tokenizer = preprocessor.tokenizer  # tracked: the vocabulary table travels
            self.labels = tf.constant(labels)

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text")])
        def serve(self, text):
            words = tf_text.regex_split(text, WHITESPACE + "+")  # (batch, words) ragged
            batch = tf.shape(text, out_type=tf.int64)[0]
            pieces = _pieces_or_unk(self.tokenizer, words.flat_values, unk_id)  # (n, pieces)
            length = pieces.row_lengths()  # (n,)
            word_example = words.value_rowids()
            # Pieces before each word within its example: positions 1.. after [CLS].
            before = tf.cumsum(length, exclusive=True)
            bounds = tf.concat([before, tf.reshape(tf.reduce_sum(length), [1])], axis=0)
            example_base = tf.gather(bounds, words.row_splits[:-1])
            first = 1 + before - tf.gather(example_base, word_example)  # first piece's position
            kept = first + length <= seq - 1  # a prefix of each sentence (room for [SEP])
            kept_pieces = tf.ragged.boolean_mask(pieces, kept).flat_values
            kept_length = tf.math.unsorted_segment_sum(tf.where(kept, length, 0), word_example,
                                                       batch)
            body = tf.RaggedTensor.from_row_lengths(kept_pieces, kept_length)
            ends = tf.RaggedTensor.from_tensor(tf.ones(tf.stack([batch, 1]), tf.int32))
            token_ids = tf.concat([ends * cls_id, body, ends * sep_id], axis=1)
            token_ids = token_ids.to_tensor(default_value=pad_id, shape=[None, seq])
            inputs = {"token_ids": token_ids, "segment_ids": tf.zeros_like(token_ids),
                      "padding_mask": tf.cast(token_ids != pad_id, tf.int32)}
            logits = tf.cast(self.model(inputs, training=False)["logits"], tf.float32)
            probs = tf.nn.softmax(logits, axis=-1)  # (batch, seq, labels)

            as_words = lambda flat, default: tf.RaggedTensor.from_row_splits(  # noqa: E731
                flat, words.row_splits).to_tensor(default_value=default)
            in_text = as_words(tf.ones_like(kept), False)
            kept_dense = as_words(kept, False)
            position = tf.where(kept_dense, as_words(first, tf.constant(0, tf.int64)), 0)
            word_probs = tf.gather(probs, position, batch_dims=1)  # (batch, words, labels)
            label = tf.gather(self.labels, tf.argmax(word_probs, axis=-1))
            label = tf.where(kept_dense, label, tf.where(in_text, fallback, ""))
            score = tf.where(kept_dense, tf.reduce_max(word_probs, axis=-1), 0.0)
            return {"words": words.to_tensor(default_value=""), "labels": label,
                    "scores": score, "word_count": tf.cast(words.row_lengths(), tf.int32)}

    return TokenServing()


# ---------------------------------------------------------------------------
# Extractive question answering
# ---------------------------------------------------------------------------
def build_qa_module(model, preprocessor, max_query_length: int, doc_stride: int,
                    n_best: int = 20, max_answer_length: int = 30, version_2: bool = False,
                    null_score_threshold: float = 0.0):
    """A tf.Module whose `serve(question, context)` answers from the context (module docstring)."""
    import tensorflow as tf
    import tensorflow_text as tf_text

    from pipeline.text.preprocessor import word_split_patterns

    seq = preprocessor.seq_length
    cls_id, sep_id = preprocessor.cls_id, preprocessor.sep_id
    pad_id, unk_id = preprocessor.pad_id, preprocessor.unk_id
    top = min(int(n_best), seq)

    class QAServing(tf.Module):
        def __init__(self):
            super().__init__(name="qa_serving")
            self.model = model
            self.tokenizer = preprocessor.tokenizer  # tracked: the vocabulary table travels

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="question"),
                                      tf.TensorSpec([None], tf.string, name="context")])
        def serve(self, question, context):
            batch = tf.shape(question, out_type=tf.int64)[0]
            # The question: its pieces, cut to max_query_length ([UNK] if none).
            q = tf.cast(self.tokenizer(question), tf.int32)[:, :max_query_length]
            q = _nonempty(q, unk_id)
            q_len = q.row_lengths()  # (batch,)
            # The context: words and punctuation marks with byte offsets, then their pieces.
            tokens, begin, end = tf_text.regex_split_with_offsets(
                context, *word_split_patterns("re2"))
            pieces = _pieces_or_unk(self.tokenizer, tokens.flat_values, unk_id)
            piece_token = pieces.value_rowids()  # the (flat) context token of each piece
            doc_len = tf.math.unsorted_segment_sum(pieces.row_lengths(), tokens.value_rowids(),
                                                   batch)
            doc = tf.RaggedTensor.from_row_lengths(pieces.flat_values, doc_len)
            doc_token = tf.RaggedTensor.from_row_lengths(piece_token, doc_len)

            # Windows (qa_features): `room` pieces every min(room, doc_stride) pieces.
            room = seq - q_len - 3
            tf.debugging.assert_positive(
                room, message=f"max_seq_length {seq} leaves no room for the context after the "
                              f"question; lower max_query_length ({max_query_length})")
            step = tf.minimum(room, doc_stride)
            windows = 1 + tf.maximum((doc_len - room + step - 1) // step, 0)  # (batch,)
            row_example = tf.repeat(tf.range(batch), windows)  # (rows,)
            row_window = tf.ragged.range(windows).flat_values
            r_room = tf.gather(room, row_example)
            r_step = tf.gather(step, row_example)
            r_doc_len = tf.gather(doc_len, row_example)
            r_q_len = tf.gather(q_len, row_example)
            r_start = row_window * r_step
            r_length = tf.minimum(r_doc_len - r_start, r_room)
            offset = r_q_len + 2  # [CLS] question [SEP]

            j = tf.range(seq, dtype=tf.int64)[tf.newaxis, :]  # (1, seq)
            q_rows = tf.gather(q.to_tensor(default_value=pad_id), row_example)
            doc_dense = tf.concat([doc.to_tensor(default_value=pad_id),
                                   tf.fill(tf.stack([batch, 1]), pad_id)], axis=1)
            token_dense = tf.concat([doc_token.to_tensor(default_value=0),
                                     tf.zeros(tf.stack([batch, 1]), tf.int64)], axis=1)
            doc_rows = tf.gather(doc_dense, row_example)
            doc_pos = r_start[:, None] + j - offset[:, None]  # (rows, seq): doc piece index
            in_context = (j >= offset[:, None]) & (j < (offset + r_length)[:, None])
            safe_pos = tf.where(in_context, doc_pos, 0)
            q_index = tf.clip_by_value(j - 1, 0, tf.cast(tf.shape(q_rows)[1] - 1, tf.int64))
            q_index = tf.broadcast_to(q_index, tf.shape(safe_pos, out_type=tf.int64))
            token_ids = tf.where(
                j == 0, cls_id, tf.where(
                    (j >= 1) & (j <= r_q_len[:, None]),
                    tf.gather(q_rows, q_index, batch_dims=1),
                    tf.where(j == r_q_len[:, None] + 1, sep_id, tf.where(
                        in_context, tf.gather(doc_rows, safe_pos, batch_dims=1),
                        tf.where(j == (offset + r_length)[:, None], sep_id, pad_id)))))
            segment_ids = tf.cast((j >= offset[:, None]) & (j <= (offset + r_length)[:, None]),
                                  tf.int32)
            inputs = {"token_ids": token_ids, "segment_ids": segment_ids,
                      "padding_mask": tf.cast(token_ids != pad_id, tf.int32)}
            outputs = self.model(inputs, training=False)
            start_logits = tf.cast(outputs["start_logits"], tf.float32)  # (rows, seq)
            end_logits = tf.cast(outputs["end_logits"], tf.float32)

            # Maximum context (BERT's _check_is_max_context), in float64 as in Python.
            max_windows = tf.reduce_max(windows)
            k = tf.range(max_windows)[tf.newaxis, tf.newaxis, :]  # (1, 1, windows)
            k_start = k * r_step[:, None, None]
            k_length = tf.minimum(r_doc_len[:, None, None] - k_start, r_room[:, None, None])
            k_end = k_start + k_length - 1
            p = doc_pos[:, :, None]
            contains = (k < tf.gather(windows, row_example)[:, None, None]) & \
                (p >= k_start) & (p <= k_end)
            k_score = tf.cast(tf.minimum(p - k_start, k_end - p), tf.float64) + \
                0.01 * tf.cast(k_length, tf.float64)
            k_score = tf.where(contains, k_score, -float("inf"))
            best_k = _first_index(contains & (k_score >= tf.reduce_max(k_score, -1,
                                                                       keepdims=True)), -1)
            max_context = in_context & (best_k == row_window[:, None])

            # n-best search per window: the top starts and ends, valid pairs, start + end logit.
            starts = tf.math.top_k(start_logits, top).indices  # (rows, top)
            ends = tf.math.top_k(end_logits, top).indices
            s_ok = tf.gather(max_context, starts, batch_dims=1)
            e_ok = tf.gather(in_context, ends, batch_dims=1)
            s, e = starts[:, :, None], ends[:, None, :]
            valid = s_ok[:, :, None] & e_ok[:, None, :] & (e >= s) & \
                (e - s + 1 <= max_answer_length)
            pair_score = tf.gather(start_logits, starts, batch_dims=1)[:, :, None] + \
                tf.gather(end_logits, ends, batch_dims=1)[:, None, :]
            pair_score = tf.reshape(tf.where(valid, pair_score, -float("inf")), [-1, top * top])
            valid = tf.reshape(valid, [-1, top * top])
            row_best = tf.reduce_max(pair_score, axis=-1)  # (rows,)
            pair = _first_index(valid & (pair_score >= row_best[:, None]), -1)
            pair = tf.minimum(pair, top * top - 1)
            row_s = tf.gather(starts, pair // top, batch_dims=1)
            row_e = tf.gather(ends, pair % top, batch_dims=1)
            row_has = tf.reduce_any(valid, axis=-1)

            # Across the windows of a question: the first window with the best score.
            ex_best = tf.math.unsorted_segment_max(tf.where(row_has, row_best, -float("inf")),
                                                   row_example, batch)
            rows = tf.shape(row_example, out_type=tf.int64)[0]
            chosen = row_has & (row_best >= tf.gather(ex_best, row_example))
            row_index = tf.range(rows)
            first_row = tf.math.unsorted_segment_min(tf.where(chosen, row_index, rows),
                                                     row_example, batch)
            has = first_row < rows
            first_row = tf.minimum(first_row, rows - 1)
            null = tf.math.unsorted_segment_min(start_logits[:, 0] + end_logits[:, 0],
                                                row_example, batch)
            score = tf.where(has, ex_best, -float("inf"))

            # The span's bytes in the context: first byte of the start piece's token, last of
            # the end piece's token.
            s_doc = tf.gather(tf.gather(doc_pos, first_row), tf.cast(
                tf.gather(row_s, first_row), tf.int64), batch_dims=1)
            e_doc = tf.gather(tf.gather(doc_pos, first_row), tf.cast(
                tf.gather(row_e, first_row), tf.int64), batch_dims=1)
            s_token = tf.gather(token_dense, tf.where(has, s_doc, 0), batch_dims=1)
            e_token = tf.gather(token_dense, tf.where(has, e_doc, 0), batch_dims=1)
            zero = tf.zeros([1], tf.int64)  # (an index for "no token" when there are none)
            byte_start = tf.gather(tf.concat([begin.flat_values, zero], 0), s_token)
            byte_end = tf.gather(tf.concat([end.flat_values, zero], 0), e_token)
            answer = tf.strings.substr(context, tf.where(has, byte_start, 0),
                                       tf.where(has, byte_end - byte_start, 0))
            if version_2:  # null - best > threshold -> "" (compared in float64 like Python)
                null_wins = tf.cast(null, tf.float64) - tf.cast(score, tf.float64) > \
                    null_score_threshold
                has = has & ~null_wins
                answer = tf.where(has, answer, "")
            char_start = tf.strings.length(
                tf.strings.substr(context, tf.zeros_like(byte_start), byte_start),
                unit="UTF8_CHAR")
            char_end = char_start + tf.strings.length(answer, unit="UTF8_CHAR")
            return {"answer": tf.where(has, answer, ""), "score": score, "null_score": null,
                    "start": tf.where(has, char_start, -1), "end": tf.where(has, char_end, -1)}

    return QAServing()

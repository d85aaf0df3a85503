"""Look inside a trained BERT: fill-mask, next-sentence probability, attention maps, embeddings.

The functions under the CLI take a model (a `.keras` `BertPretrainer`, a
`LoadedModel`, or, for attention and embed, a bare `BertEncoder`) and a `Tokenizer`:

    model, tokenizer = load(run_dir="runs/default")
    fill_mask(model, tokenizer, "The man went to the [MASK].")[0][0]  # {"token", "id", "probability"}
    nsp_probability(model, tokenizer, "The man went to the store.", "He bought milk.")  # P(IsNext)
    attention_maps(model, tokenizer, "The cat sat on the mat.")  # (layers, heads, seq, seq)
    embed(model, tokenizer, ["a text", "another"], pooling="mean")  # (2, hidden)

Attention weights come from each Transformer layer's own attention computation
(`TransformerEncoder(..., return_attention_scores=True)`), run layer by layer on
the embeddings; `attention_maps` checks that the last recomputed layer output equals
the model's `sequence_output`, so the maps are the ones the model used.

The command line is pipeline/tools/inspect_model.py (`python -m pipeline fill-mask ...`).
"""

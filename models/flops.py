"""Model FLOPs of one BERT pretraining step, for model FLOP utilisation (MFU).

Counted as in the PaLM/Chinchilla convention: matrix multiplications only, 2 FLOPs per
multiply-add, training = 3 × forward (the backward pass costs twice the forward).
Per sequence of `S` tokens with `P` masked positions:

    encoder    L · (2·S·(4·H² + 2·H·I) + 4·S²·H)    (Q, K, V, output projections, FFN;
                                                   attention scores and weighted sum)
    pooler     2·H²                                (the [CLS] dense)
    MLM head   2·P·(H² + H·V)                      (dense + tied decoder, masked positions only)
    NSP head   2·H·2

With ALBERT's factorized embeddings (`embedding_dim` E < H) the embedding projection adds
2·S·E·H, and the MLM head becomes 2·P·(H·E + E·V) (its transform outputs E, the tied decoder
is E × V). Cross-layer sharing (ALBERT) changes the parameter count, not the FLOPs: the
shared layer still runs L times.

which is the usual 6·N_non-embedding + 12·L·S·H per token for the encoder. Embedding
lookups, softmax, LayerNorm and activations are not counted (they are not "useful"
matmul FLOPs), so MFU stays comparable across implementations. Pure Python.

    >>> round(training_flops_per_token(num_layers=4, hidden_dim=512, intermediate_dim=2048,
    ...                                vocabulary_size=30522, seq_length=128,
    ...                                num_predictions=20) / 1e6, 1)
    93.6
"""

from __future__ import annotations


def forward_flops_per_sequence(num_layers: int, hidden_dim: int, intermediate_dim: int,
                               vocabulary_size: int, seq_length: int,
                               num_predictions: int, embedding_dim: int | None = None) -> float:
    L, H, I, V, S, P = (num_layers, hidden_dim, intermediate_dim, vocabulary_size, seq_length,
                        num_predictions)
    E = embedding_dim or H
    projection = 2 * S * E * H if E != H else 0
    encoder = L * (2 * S * (4 * H * H + 2 * H * I) + 4 * S * S * H)
    pooler = 2 * H * H
    mlm = 2 * P * (H * E + E * V)
    nsp = 2 * H * 2
    return float(projection + encoder + pooler + mlm + nsp)


def training_flops_per_sequence(**sizes) -> float:
    """3 × the forward FLOPs (forward + backward)."""
    return 3.0 * forward_flops_per_sequence(**sizes)


def training_flops_per_token(**sizes) -> float:
    return training_flops_per_sequence(**sizes) / sizes["seq_length"]

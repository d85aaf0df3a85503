"""BERT sizes from Google's published configs (google-research/bert README).

Attention heads = hidden / 64 and the feed-forward width = 4 x hidden, as in the
paper. Every size shares: 512 positions, 2 segment types, dropout 0.1, GELU,
LayerNorm epsilon 1e-12, truncated-normal init with stddev 0.02.

    >>> from models import presets
    >>> presets.PRESETS["base"]["num_layers"]
    12
"""

PRESETS = {
    "tiny": dict(num_layers=2, hidden_dim=128, num_heads=2, intermediate_dim=512),
    "mini": dict(num_layers=4, hidden_dim=256, num_heads=4, intermediate_dim=1024),
    "small": dict(num_layers=4, hidden_dim=512, num_heads=8, intermediate_dim=2048),
    "medium": dict(num_layers=8, hidden_dim=512, num_heads=8, intermediate_dim=2048),
    "base": dict(num_layers=12, hidden_dim=768, num_heads=12, intermediate_dim=3072),
    "large": dict(num_layers=24, hidden_dim=1024, num_heads=16, intermediate_dim=4096),
}

# Google's English vocabularies (uncased and cased) have 30,522 and 28,996 entries.
GOOGLE_VOCAB_SIZE = 30522

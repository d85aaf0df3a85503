"""What each config key allows, read from its declaration (pipeline/config/sections.py,
beam_jobs/settings.py): its choices, or its range (checked by validation.py).

    >>> CHOICES["train.optimizer"]
    ('adamw', 'lamb')
    >>> [r for r in RANGES if r[0] == "data.masked_lm_prob"]
    [('data.masked_lm_prob', 0.0, 1.0, False)]
"""

from __future__ import annotations

from pipeline.config.keys import declared
from pipeline.config.sections import Config

KEYS = declared(Config)

# key -> the values allowed
CHOICES = {name: key.choices for name, key in KEYS.items() if key.choices}

# (key, lowest allowed, highest allowed or None, inclusive low?)
RANGES = [(name, *key.range()) for name, key in KEYS.items() if key.range()]

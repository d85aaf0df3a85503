"""The fine-tuning tasks, one class per task (pipeline/finetuning/tasks/base.py says what a
task owns). Importing this package registers them; `get(name, fc)` returns one.

    classification         one label per text or text pair (long documents: windows)
    regression             a number per text or text pair
    token_classification   a tag per word
    question_answering     SQuAD spans (v1.1 / v2.0)
    semantic_search        a bi-encoder on (text, text_pair) pairs
"""

from pipeline.finetuning.tasks.base import INPUTS, FinetuneTask, Split, get, names, register
# Each module registers its task; this order is the order error messages list them in.
from pipeline.finetuning.tasks import classification  # noqa: F401,I001
from pipeline.finetuning.tasks import regression  # noqa: F401
from pipeline.finetuning.tasks import token_classification  # noqa: F401
from pipeline.finetuning.tasks import question_answering  # noqa: F401
from pipeline.finetuning.tasks import semantic_search  # noqa: F401

__all__ = ["INPUTS", "FinetuneTask", "Split", "get", "names", "register"]

"""`python -m pipeline ...`: see pipeline/cli.py."""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # keep TensorFlow's start-up chatter out

from pipeline.cli import main  # noqa: E402

sys.exit(main())

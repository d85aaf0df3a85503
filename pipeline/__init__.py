"""The pipeline: stages (pipeline/stages/) and the libraries they call, by role.

MLflow 3 sends usage telemetry to its maintainers' service by default, from a thread that is
joined when the process exits (about a second per invocation here, and a request that cannot
succeed on a machine without internet). The pipeline turns it off unless the user has chosen:
MLFLOW_DISABLE_TELEMETRY=false in the environment turns it back on.
"""

import os

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

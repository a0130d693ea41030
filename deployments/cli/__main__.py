"""``python -m recallserve.deployments.cli``: the ``recallserve`` console script, for scripts that run it
with a given interpreter (``sys.executable``) instead of looking it up on ``PATH``."""

import sys

from recallserve.deployments.cli import main

sys.exit(main())

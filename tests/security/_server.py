"""The security rig's app as a real server process, for the kill -9 check.

``python -m tests.security._server DATA_DIR PORT`` serves :func:`tests.unit.edge.conftest.build_app`
(real memory service on two hybrid shards with their WALs under ``DATA_DIR``, session store,
experience service) on ``127.0.0.1:PORT`` until it is killed. A second start on the same folder
replays the WALs, as a shard replica restarted by Ray does. ``test_kill9.py`` runs :func:`main` in
processes forked from a ``forkserver`` that has imported this module (the imports paid once).
"""

from __future__ import annotations

import sys
from pathlib import Path

import uvicorn

from tests.unit.edge.conftest import build_app


def main(argv: list[str]) -> None:
    data, port = Path(argv[0]), int(argv[1])
    app, _memory = build_app(data)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main(sys.argv[1:])

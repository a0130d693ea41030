"""Serve the summed metrics of every process on this pod: ``python -m recallserve.serve.api.metrics_exporter``.

On Kubernetes a scrape of ``/metrics`` through the Serve port lands on any ingress replica of the
cluster, so Prometheus could not tell pods or replicas apart. The Helm chart therefore runs this
exporter beside the Ray container of every pod, on a fixed port: both mount one ``emptyDir`` at
``$PROMETHEUS_MULTIPROC_DIR``, the Ray processes write their metrics there, and this process
renders their sum (:func:`recallserve.serve.api.metrics.render_metrics`) for Prometheus to scrape pod by pod.
The pod shares one process namespace, so files of exited processes are recognised and dropped.

    python -m recallserve.serve.api.metrics_exporter --dir /tmp/recallserve-metrics --host 0.0.0.0 --port 9464
"""

from __future__ import annotations

import argparse
import logging
import os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from recallserve.serve.api.metrics import CONTENT_TYPE_LATEST, MULTIPROC_ENV, render_metrics

__all__ = ["build_server", "main"]

log = logging.getLogger("recallserve.metrics_exporter")


def build_server(folder: Path, host: str, port: int) -> ThreadingHTTPServer:
    """An HTTP server answering ``GET /metrics`` (the folder's sum) and ``GET /healthz``."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the http.server protocol
            if self.path.split("?", 1)[0] == "/metrics":
                body, ctype, status = render_metrics(folder), CONTENT_TYPE_LATEST, 200
            elif self.path == "/healthz":
                body, ctype, status = b"ok\n", "text/plain", 200
            else:
                body, ctype, status = b"not found: try /metrics\n", "text/plain", 404
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
            log.debug(format, *args)

    return ThreadingHTTPServer((host, port), Handler)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m recallserve.serve.api.metrics_exporter", description=__doc__.split("\n")[0])
    p.add_argument("--dir", type=Path, default=os.environ.get(MULTIPROC_ENV) or None,
                   help=f"the multiprocess metrics folder (default ${MULTIPROC_ENV})")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; 0.0.0.0 in a pod)")
    p.add_argument("--port", type=int, default=9464, help="port (default 9464)")
    args = p.parse_args(argv)
    if args.dir is None:
        p.error(f"--dir: no metrics folder given and ${MULTIPROC_ENV} is unset")
    if not 0 < args.port < 65536:
        p.error(f"--port: must be 1-65535, got {args.port}")
    args.dir.mkdir(parents=True, exist_ok=True)
    server = build_server(args.dir, args.host, args.port)
    print(f"recallserve metrics exporter: {args.dir} on http://{args.host}:{server.server_port}/metrics", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

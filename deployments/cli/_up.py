"""``recallserve up``: start the cluster (embedded Ray + the app) and serve until Ctrl-C."""

from __future__ import annotations

import argparse
import os
import time

from recallserve.deployments.cli import UserError, add_profile_arguments
from recallserve.deployments.models import ModelError

__all__ = ["add_parser"]


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser("up", help="start the cluster and serve the OpenAI-compatible API until Ctrl-C")
    add_profile_arguments(p)
    p.add_argument("--host", default=None, help="bind address (default from the profile: 127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help="HTTP port (default from the profile: 8000)")
    p.add_argument("--demo", action="store_true",
                   help="load the demo customer-service world (repair manual, past tickets) as shared memories")
    p.add_argument("--state-dsn", default=None, metavar="DSN",
                   help="keep sessions, experiences and traces in this PostgreSQL database (every ingress replica "
                        "opens its own pool) instead of SQLite in state_dir; also $RECALLSERVE_STATE_DSN")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from recallserve.deployments.config import STATE_DSN_ENV, ConfigError, load_config

    server: dict[str, object] = {}
    overrides: dict[str, object] = {}
    if args.state_dsn:
        # NOTE: through the environment (inherited by the local Ray's workers), never the deployment
        # config Ray shows: the DSN carries a password.
        os.environ[STATE_DSN_ENV] = args.state_dsn
        overrides["state_db"] = {"dsn_env": STATE_DSN_ENV}
    if args.host:
        server["host"] = args.host
    if args.port:
        server["port"] = args.port
    try:
        if server:
            overrides["server"] = server
        config = load_config(profile=args.profile, path=args.config, overrides=overrides or None)
        if config.state_db.enabled:
            config.state_db.resolve()  # NOTE: a missing DSN fails here, not on every replica
    except ConfigError as exc:
        raise UserError(str(exc)) from None

    try:
        if not config.auth.resolve():
            raise UserError(f"no API keys: set auth.keys in the profile or {config.auth.keys_env}='key:tenant'")
    except ConfigError as exc:
        raise UserError(str(exc)) from None

    from recallserve.deployments import runner

    start = time.perf_counter()
    print(f"recallserve: profile {config.profile}: preparing models", flush=True)
    try:
        runner.prepare_models(config)
    except ModelError as exc:
        raise UserError(str(exc)) from None
    print(f"recallserve: starting Ray (files in {config.ray.temp_dir}) and deploying "
          f"{len(config.deployment_options())} deployments...", flush=True)

    def ready() -> None:
        url = f"http://{config.server.host}:{config.server.port}"
        print(f"recallserve: ready in {time.perf_counter() - start:.1f} s at {url}/v1 "
              f"(model '{config.chat.model_name}'), console at {url}/console; Ctrl-C to stop", flush=True)

    runner.run_forever(config, on_ready=ready, demo=args.demo)
    print("recallserve: stopped", flush=True)
    return 0

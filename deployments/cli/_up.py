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
    p.add_argument("--nodes", type=int, default=None, metavar="N",
                   help="start a head and N-1 worker raylets on this host (development and tests): memory shards on "
                        "different workers, at least 2 ingress replicas, Serve's proxy on the head (ray.nodes)")
    p.add_argument("--redis-address", default=None, metavar="HOST:PORT",
                   help="with --nodes: keep the GCS's tables in this Redis (GCS fault tolerance; password from "
                        "$RECALLSERVE_REDIS_PASSWORD)")
    p.add_argument("--demo", action="store_true",
                   help="load the demo customer-service world (repair manual, past tickets) as shared memories")
    p.add_argument("--state-dsn", default=None, metavar="DSN",
                   help="keep sessions, experiences and traces in this PostgreSQL database (every ingress replica "
                        "opens its own pool) instead of SQLite in state_dir; also $RECALLSERVE_STATE_DSN")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from recallserve.deployments.config import STATE_DSN_ENV, ConfigError, load_config

    server: dict[str, object] = {}
    if args.host:
        server["host"] = args.host
    if args.port:
        server["port"] = args.port
    overrides: dict[str, object] = {"server": server} if server else {}
    if args.state_dsn:
        # NOTE: through the environment (inherited by the local Ray's workers), never the deployment
        # config Ray shows: the DSN carries a password.
        os.environ[STATE_DSN_ENV] = args.state_dsn
        overrides["state_db"] = {"dsn_env": STATE_DSN_ENV}
    if args.nodes is not None:
        # NOTE: several raylets share this host's address: only the head's proxy serves the port, so
        # the one-node HAProxy ingress is replaced by Serve's proxy.
        overrides["ray"] = {"nodes": args.nodes, **({"ingress": "proxy"} if args.nodes > 1 else {})}
    if args.redis_address is not None:
        overrides.setdefault("ray", {})["redis_address"] = args.redis_address  # type: ignore[index]
    try:
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
    where = f"{config.ray.nodes} Ray nodes on this host" if config.ray.nodes > 1 else "Ray"
    print(f"recallserve: starting {where} (files in {config.ray.temp_dir}) and deploying "
          f"{len(config.deployment_options())} deployments...", flush=True)

    def ready() -> None:
        url = f"http://{config.server.host}:{config.server.port}"
        print(f"recallserve: ready in {time.perf_counter() - start:.1f} s at {url}/v1 "
              f"(model '{config.chat.model_name}'), console at {url}/console; Ctrl-C to stop", flush=True)

    runner.run_forever(config, on_ready=ready, demo=args.demo)
    print("recallserve: stopped", flush=True)
    return 0

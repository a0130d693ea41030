"""Start Ray (embedded or existing), deploy the app, wait, and shut down cleanly.

Used by ``recallserve up`` and by the integration tests. Local runs keep Ray's files inside a
folder the user can see (``ray.temp_dir``), never ask for GPUs on a CPU profile, and set
``RAY_AUTH_MODE=disabled`` so no auth token is written under the home folder.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from recallserve.deployments._ray_paths import ray_temp_dir
from recallserve.deployments.config import ROLES, AppConfig
from recallserve.deployments.engines import LlamaCppConfig
from recallserve.deployments.jobs._live import ray_connection
from recallserve.deployments.local_nodes import LocalNodes, environment
from recallserve.deployments.models import resolve_model_path
from recallserve.serve.api.metrics import MULTIPROC_ENV

__all__ = ["prepare_models", "start_ray", "local_nodes", "deploy", "redeploy", "load_demo", "shutdown", "run_forever"]

log = logging.getLogger("recallserve.runner")


def prepare_models(config: AppConfig, *, progress: bool = True) -> dict[str, Path]:
    """Join and verify every local model file before deploying (progress bar on first start).

    Doing it here, in the foreground, means a missing package or a hash mismatch is one clear
    error in the terminal rather than a replica crash-looping inside Ray.
    """
    paths: dict[str, Path] = {}
    for role in ROLES:
        engine = getattr(config, role).engine
        if isinstance(engine, LlamaCppConfig):
            paths[role] = resolve_model_path(engine.model, progress=progress)
    return paths


def start_ray(config: AppConfig) -> None:
    """Start an embedded Ray (or connect to ``config.ray.address``)."""
    if config.ray.auth_disabled:
        os.environ["RAY_AUTH_MODE"] = "disabled"
    # NOTE: Ray would otherwise print usage-stats prompts and try to reach the network.
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray

    if ray.is_initialized():
        return
    if config.ray.address is not None:
        ray.init(address=config.ray.address, log_to_driver=False)
        return
    # NOTE: a deep folder is reached through a short alias, or Ray's socket paths overflow 107 bytes.
    temp_dir = ray_temp_dir(config.ray.temp_dir)
    if config.ray.nodes > 1:
        _start_local_nodes(config, temp_dir)
        return
    with _metrics_folder(temp_dir.resolve() / "recallserve-metrics"), _worker_niceness(config.ray.worker_niceness), \
            _throughput_mode(config.ray.throughput_optimized), _haproxy_ingress(config, temp_dir):
        ray.init(
            num_cpus=config.ray.num_cpus,
            num_gpus=config.ray.num_gpus,
            include_dashboard=False,
            _temp_dir=str(temp_dir),
            log_to_driver=False,
            configure_logging=True,
            logging_level=logging.WARNING,
        )


_LOCAL_NODES: list[LocalNodes] = []


def local_nodes() -> LocalNodes | None:
    """The raylets :func:`start_ray` started on this host when ``ray.nodes`` > 1 (else None)."""
    return _LOCAL_NODES[0] if _LOCAL_NODES else None


def _start_local_nodes(config: AppConfig, temp_dir: Path) -> None:
    """A head and ``ray.nodes - 1`` workers on this host (``deployments.local_nodes``), then connect to them.

    The variables the one-node start sets while Ray starts (metrics folder, worker niceness, Serve's
    mode) are captured once and given to every raylet, the replacement workers included.
    """
    import ray

    before = dict(os.environ)
    with _metrics_folder(temp_dir.resolve() / "recallserve-metrics"), _worker_niceness(config.ray.worker_niceness), \
            _throughput_mode(config.ray.throughput_optimized):
        env = {k: v for k, v in os.environ.items() if before.get(k) != v}
    nodes = LocalNodes(temp_dir, config.ray.nodes, config.ray.num_cpus, len(config.shard_deployment_names()), env,
                       config.ray.redis_address)
    _LOCAL_NODES.append(nodes)
    nodes.start()
    ray.init(address=nodes.gcs_address, log_to_driver=False, configure_logging=True,
             logging_level=logging.WARNING)


@contextlib.contextmanager
def _haproxy_ingress(config: AppConfig, temp_dir: Path) -> Iterator[None]:
    """Start the embedded Ray with Serve's HAProxy ingress (``ray.ingress: haproxy``; see ``recallserve.deployments._haproxy``).

    NOTE: these variables win over the user's (direct ingress must be on, and the binary must be
    the wrapper that keeps HAProxy on server.host); they are set only while Ray starts, as above.
    """
    if config.ray.ingress != "haproxy":
        yield
        return
    from recallserve.deployments._haproxy import haproxy_env, haproxy_folder, haproxy_per_key_max

    env = haproxy_env(haproxy_folder(temp_dir), config.server.host, config.ingress.queue_full_retry_after_s or 1.0,
                      config.ingress.max_ongoing_requests, config.ray.haproxy_queue_s,
                      config.ray.haproxy_request_timeout_s, haproxy_per_key_max(config))
    with environment(env):
        yield


@contextlib.contextmanager
def _worker_niceness(niceness: int | None) -> Iterator[None]:
    """Start the embedded Ray's workers at ``niceness`` (``RAY_worker_niceness``, read by the raylet).

    NOTE: Ray starts its workers at niceness 15 so that a desktop stays responsive; on a machine
    that serves, the replicas are the job, and at 15 they yield the cores to every normal-priority
    process (Ray's own raylet and GCS included). Where the kernel groups processes by session
    (``sched_autogroup``), niceness only orders processes of one session, so this does not shield
    the replicas from another session's work. The variable is set only while Ray starts and is
    taken back afterwards, as for the metrics folder.
    """
    if niceness is None or os.environ.get(_NICENESS_ENV) is not None:
        yield
        return
    os.environ[_NICENESS_ENV] = str(niceness)
    try:
        yield
    finally:
        os.environ.pop(_NICENESS_ENV, None)


_NICENESS_ENV = "RAY_worker_niceness"

#: Ray Serve's throughput-optimized mode without its direct ingress (which would serve HTTP from the ingress
#: replicas on ports of their own, not server.port), with the proxy on the gRPC data plane too, and with
#: Serve's logging as without the mode: every line written at once and to stderr as well (the mode buffers
#: 1,000 lines and drops stderr, so the traceback of a replica that dies was lost; no speed difference
#: was measurable from those two). Handle routers keep their own loop: the mode's router on the replica's
#: loop refuses a handle's blocking ``.result()``, which context-mode and the experience service call
#: from worker threads (``recallserve.deployments.ingress._sync_embed``: every segmented turn answered 500).
THROUGHPUT_ENV = {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "1", "RAY_SERVE_ENABLE_DIRECT_INGRESS": "0",
                  "RAY_SERVE_PROXY_USE_GRPC": "1", "RAY_SERVE_REQUEST_PATH_LOG_BUFFER_SIZE": "1",
                  "RAY_SERVE_LOG_TO_STDERR": "1", "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": "1"}


@contextlib.contextmanager
def _throughput_mode(enabled: bool) -> Iterator[None]:
    """Start the embedded Ray in Serve's throughput-optimized mode (``ray.throughput_optimized``).

    NOTE: Ray Serve reads these variables when a process imports it, so they must be in the
    raylet's environment (every replica, the proxy and the controller are its children); as for
    the niceness, they are set only while Ray starts and taken back afterwards, and a value the
    user already exported wins. The handles the driver made keep actor calls (its Serve was
    imported earlier): the ingress moves them to the gRPC data plane (``handles.on_data_plane``).
    Measured on cpu-local (2 cores, 2,000 memories, ``bench search``, with the batched renewals of
    the same change and the routers still on the replica's loop): CPU per search 90 -> 61 ms,
    1 client p50 67 -> 48 ms, 4 clients 21.9 -> 32.2 searches/s
    (loadtests/results/bench-search-cpu-local-throughput.md).
    """
    if not enabled:
        yield
        return
    added = [name for name in THROUGHPUT_ENV if os.environ.get(name) is None]
    for name in added:
        os.environ[name] = THROUGHPUT_ENV[name]
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)


@contextlib.contextmanager
def _metrics_folder(folder: Path) -> Iterator[None]:
    """Give the Ray processes started inside this block one prometheus multiprocess folder.

    Every process on the machine then writes its metrics there and ``/metrics`` on any ingress
    replica renders the sum (``recallserve.serve.api.metrics``). The variable is set only while Ray starts
    (its raylet, and so every worker, inherits it) and is taken back afterwards, so the driver
    (and a test process that starts several clusters) keeps its own in-process registry. A
    folder the user already named in ``PROMETHEUS_MULTIPROC_DIR`` is used as it is.
    """
    import prometheus_client.values  # noqa: F401 - fixes this process's value class before the variable exists

    if os.environ.get(MULTIPROC_ENV):
        yield
        return
    # NOTE: a fresh folder per start: files of an earlier cluster would add its counts.
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    os.environ[MULTIPROC_ENV] = str(folder)
    try:
        yield
    finally:
        os.environ.pop(MULTIPROC_ENV, None)


def deploy(config: AppConfig, *, timeout_s: float = 600.0) -> None:
    """Start Serve's HTTP proxy on the configured host/port and deploy the app; waits until running."""
    from ray import serve

    from recallserve.deployments.app import build_app

    # NOTE: the raylets of ray.nodes > 1 share this host's address, so one proxy (the head's) serves the port.
    serve.start(http_options={"host": config.server.host, "port": config.server.port},
                proxy_location="HeadOnly" if config.ray.nodes > 1 and config.ray.address is None else None)
    app = build_app(config)
    serve.run(app, name=config.name, route_prefix="/", blocking=False)
    _wait_running(config.name, timeout_s)


def redeploy(config: AppConfig, *, address: str | None = None, timeout_s: float = 600.0) -> float:
    """Update the app of a running cluster in place to ``config``; returns the seconds it took.

    Finds the cluster as the live jobs do (``address``, ``$RAY_ADDRESS``, ``ray.address``, else
    the local raylet started with the profile's ``ray.temp_dir``, i.e. ``recallserve up``). Only
    deployments whose code or arguments changed restart (``recallserve.deployments._versions``); each starts
    its successor first where ``max_surge_percent`` allows, and a replaced replica finishes its
    in-flight requests (``graceful_shutdown_timeout_s``). The HTTP host and port stay those of
    the running proxy.

    Raises:
        RuntimeError: no cluster, no Serve app named ``config.name`` on it, or the deploy failed.
        TimeoutError: the app was not running again within ``timeout_s``.
    """
    from ray import serve
    from ray.serve.exceptions import RayServeException

    # NOTE: its JobError (no cluster, unreachable) is a RuntimeError, as documented below.
    with ray_connection(address or config.ray.address, config.ray.temp_dir, config.ray.auth_disabled):
        try:
            apps = serve.status().applications
        except RayServeException as exc:
            raise RuntimeError(f"Ray Serve is not running on this cluster ({exc})") from None
        if config.name not in apps:
            raise RuntimeError(f"name: no Serve application {config.name!r} on this cluster "
                               f"(running: {', '.join(sorted(apps)) or 'none'}); start it with `recallserve up`")
        prepare_models(config)
        started = time.monotonic()
        from recallserve.deployments.app import build_app

        serve.run(build_app(config), name=config.name, route_prefix="/", blocking=False)
        _wait_running(config.name, timeout_s)
        return time.monotonic() - started


def _wait_running(name: str, timeout_s: float) -> None:
    from ray import serve

    deadline = time.monotonic() + timeout_s
    while True:
        status = serve.status().applications.get(name)
        state = str(getattr(status, "status", "")) if status else ""
        if state.endswith("RUNNING"):
            return
        if state.endswith("DEPLOY_FAILED") or state.endswith("UNHEALTHY"):
            raise RuntimeError(f"application {name} failed to deploy: {getattr(status, 'message', '')}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"application {name} not running after {timeout_s:.0f} s (state {state})")
        time.sleep(0.5)


def load_demo(config: AppConfig) -> int:
    """Load the demo world's memories (manual, past tickets) through the ingress; returns the count."""
    from ray import serve

    handle = serve.get_deployment_handle("ingress", app_name=config.name)
    return int(handle.load_demo.remote().result(timeout_s=600))


def shutdown() -> None:
    """Tear down Serve and the embedded Ray (safe to call twice)."""
    import ray
    from ray import serve

    try:
        if ray.is_initialized():
            try:
                serve.shutdown()
            finally:
                ray.shutdown()
    finally:
        while _LOCAL_NODES:
            _LOCAL_NODES.pop().shutdown()


def run_forever(config: AppConfig, on_ready: Callable[[], None] | None = None, *, demo: bool = False) -> None:
    """Deploy (and load the demo world when ``demo``), block until Ctrl-C or SIGTERM, shut down."""
    stop = threading.Event()
    serving = threading.Event()

    def _stop(signum: int, _frame: object) -> None:
        stop.set()
        if not serving.is_set():
            raise KeyboardInterrupt  # NOTE: still starting: abandon the deploy, then shut down below

    old_int = signal.getsignal(signal.SIGINT)
    old_term = signal.getsignal(signal.SIGTERM)
    try:
        start_ray(config)
        # NOTE: ray.init installs its own fatal-signal handler for SIGTERM, which prints a stack
        # and exits without shutting Ray down (measured: dashboard and runtime-env agents were
        # left running); so ours goes in after it.
        signal.signal(signal.SIGINT, _stop)
        signal.signal(signal.SIGTERM, _stop)
        deploy(config)
        if demo:
            print(f"recallserve: loaded {load_demo(config)} demo memories (manual, past tickets)", flush=True)
        serving.set()
        if on_ready is not None:
            on_ready()
        while not stop.wait(1.0):
            pass
        print("recallserve: stopping (signal received); shutting down Serve and Ray", flush=True)
    finally:
        signal.signal(signal.SIGINT, old_int)
        signal.signal(signal.SIGTERM, old_term)
        shutdown()

"""Several Ray nodes on one host: a head and workers, each its own raylet.

``recallserve up --nodes N`` (``ray.nodes: N``) starts them the way Ray's own cluster tests do
(``ray.cluster_utils.Cluster``): one ``ray._private.node.Node`` per raylet, the workers joining the
head's GCS. The ``Cluster`` helper itself is not used because it writes the cluster's address to
``/tmp/ray/ray_current_cluster``, where any ``ray.init(address="auto")`` on the machine would find it.

Each node offers the custom resources of :mod:`recallserve.deployments._node_placement`, so shards,
ingress replicas and the rest land where the placement says. Ports are picked by Ray (0 = free).
The raylets take the host's address as the one-node ``ray.init`` does (Ray's driver rewrites a
127.0.0.1 GCS address to the host's, so a GCS bound to loopback only would not be found); the
HTTP API stays on ``server.host`` (127.0.0.1), served by the head's proxy only.

GCS settings (``_system_config`` of the head, read by every raylet):

* ``health_check_period_ms`` 1000 (Ray: 3000) with ``health_check_failure_threshold`` 5: a node whose
  raylet died is declared dead after about 5 s instead of 15 s, and only then are its actors (the
  replicas) marked dead and replaced; the node-loss target is shards answering again within 30 s;
* with ``ray.redis_address`` (GCS fault tolerance): the GCS keeps its tables in that Redis and
  listens on a fixed port, so a restarted GCS (:meth:`LocalNodes.restart_gcs`) is found again by the
  raylets, which wait for it up to ``gcs_rpc_server_reconnect_timeout_s`` (120 s, as KubeRay sets it).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from recallserve.deployments._node_placement import node_resources

__all__ = ["LocalNodes", "REDIS_PASSWORD_ENV", "environment"]

log = logging.getLogger("recallserve.local_nodes")

REDIS_PASSWORD_ENV = "RECALLSERVE_REDIS_PASSWORD"
WORKER_CPUS = 2.0
"""Logical CPUs of a worker node: a shard (0.25), an ingress replica or two (0.2 each), and spare."""
_OBJECT_STORE_BYTES = 100 * 1024 * 1024
_RECONNECT_S = 120
_JOIN_TIMEOUT_S = 60.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def _redis_password() -> dict[str, str]:
    """``redis_password`` for RayParams when $RECALLSERVE_REDIS_PASSWORD is set (else Ray's default, no password)."""
    password = os.environ.get(REDIS_PASSWORD_ENV)
    return {"redis_password": password} if password else {}


@contextmanager
def environment(env: Mapping[str, str]) -> Iterator[None]:
    """``env`` set for the block (a raylet started inside inherits it, and so every worker), then taken back."""
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class LocalNodes:
    """A head and ``nodes - 1`` worker raylets on this host (see the module docstring).

    Args:
        temp_dir: Ray's temp folder (short enough for its sockets; ``_ray_paths.ray_temp_dir``).
        nodes: raylets in all (>= 2).
        head_cpus: logical CPUs of the head (the profile's ``ray.num_cpus``).
        shard_deployments: memory shard deployments to spread over the workers.
        env: variables every raylet starts with (metrics folder, niceness, Serve's mode).
        redis_address: external Redis of the GCS (fault tolerance), or None.
    """

    def __init__(self, temp_dir: Path, nodes: int, head_cpus: float | None, shard_deployments: int,
                 env: Mapping[str, str], redis_address: str | None = None) -> None:
        if nodes < 2:
            raise ValueError(f"ray.nodes: {nodes} < 2; one node is the plain embedded Ray")
        self.temp_dir, self.nodes, self.head_cpus = temp_dir, nodes, head_cpus
        self.shard_deployments, self.env, self.redis_address = shard_deployments, dict(env), redis_address
        self.head: Any = None
        self._gcs_address = ""
        self.workers: list[Any] = []

    def _params(self, head: bool, **extra: Any) -> Any:
        from ray._private.parameter import RayParams

        return RayParams(
            num_gpus=0, object_store_memory=_OBJECT_STORE_BYTES, min_worker_port=0,
            max_worker_port=0, temp_dir=str(self.temp_dir), include_dashboard=False,
            resources=node_resources(head, self.nodes, self.shard_deployments), **extra)

    @property
    def gcs_address(self) -> str:
        """host:port of the head's GCS (what ``ray.init(address=...)`` takes)."""
        return self._gcs_address

    def start(self) -> None:
        """Start the head, then the workers; returns when every node has joined."""
        from ray._private.node import Node

        system_config: dict[str, Any] = {"health_check_period_ms": 1000, "health_check_failure_threshold": 5}
        extra: dict[str, Any] = {}
        if self.redis_address is not None:
            system_config["gcs_rpc_server_reconnect_timeout_s"] = _RECONNECT_S
            # NOTE: RayParams' external_addresses is [primary, shard]; one Redis serves both (Ray does the same).
            extra = {"external_addresses": [self.redis_address, self.redis_address], "num_redis_shards": 1,
                     "gcs_server_port": _free_port(), **_redis_password()}
        with environment(self.env):
            self.head = Node(self._params(True, num_cpus=self.head_cpus, _system_config=system_config, **extra),
                             head=True, shutdown_at_exit=True, spawn_reaper=True)
        self._gcs_address = str(self.head.gcs_address)
        for _ in range(self.nodes - 1):
            self.add_worker()

    def add_worker(self) -> Any:
        """Start one worker raylet (the same resources as the others) and wait until it has joined."""
        import ray._private.services
        from ray._private.node import Node

        params = self._params(False, num_cpus=WORKER_CPUS, gcs_address=self.gcs_address, include_log_monitor=False,
                              node_manager_port=0, **_redis_password())
        params.dashboard_agent_listen_port = None  # NOTE: Ray picks a free one (the head's is taken)
        with environment(self.env):
            node = Node(params, head=False, shutdown_at_exit=True, spawn_reaper=True)
        ray._private.services.wait_for_node(node.gcs_address, node.plasma_store_socket_name, _JOIN_TIMEOUT_S)
        self.workers.append(node)
        return node

    @staticmethod
    def raylet_pid(node: Any) -> int:
        """PID of ``node``'s raylet."""
        return int(node.all_processes["raylet"][0].process.pid)

    @staticmethod
    def node_id(node: Any) -> str:
        """Ray's hex id of ``node``."""
        return str(node.node_id)

    def kill_worker(self, node: Any) -> list[int]:
        """SIGKILL a whole worker node at once: its raylet and every process under it (replicas, agents).

        Returns the PIDs killed. No process is asked to stop first; the GCS learns of the loss from
        its health checks, as it would of a machine that lost power.
        """
        import psutil

        raylet = psutil.Process(self.raylet_pid(node))
        procs = [raylet, *raylet.children(recursive=True)]
        for proc in procs:
            try:
                proc.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(procs, timeout=10)
        # NOTE: reaps the raylet's Popen (already dead) so it leaves no zombie.
        node.kill_all_processes(check_alive=False, allow_graceful=False, wait=True)
        self.workers.remove(node)
        return [p.pid for p in procs]

    def stop_gcs(self) -> int:
        """Kill the head's GCS server (SIGKILL); returns its PID. Needs ``redis_address`` to come back whole."""
        pid = int(self.head.all_processes["gcs_server"][0].process.pid)
        self.head.kill_gcs_server()
        return pid

    def start_gcs(self) -> None:
        """Start the head's GCS again on its port; it reloads its tables from Redis."""
        with environment(self.env):
            self.head.start_gcs_server()
        deadline = time.monotonic() + _JOIN_TIMEOUT_S
        while time.monotonic() < deadline:
            with socket.socket() as s:
                host, port = self.gcs_address.rsplit(":", 1)
                if s.connect_ex((host, int(port))) == 0:
                    return
            time.sleep(0.2)
        raise TimeoutError(f"GCS not listening on {self.gcs_address} after {_JOIN_TIMEOUT_S:.0f} s")

    def shutdown(self) -> None:
        """Stop every node (workers first); safe to call twice."""
        for node in [*self.workers, *([self.head] if self.head is not None else [])]:
            try:
                node.kill_all_processes(check_alive=False, allow_graceful=True, wait=True)
            except Exception as exc:  # noqa: BLE001 - stop the others anyway
                log.warning("stopping a Ray node failed: %s", type(exc).__name__)
        self.workers, self.head = [], None

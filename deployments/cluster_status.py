"""What runs where on a Ray cluster: every node and every Serve replica (``recallserve status``).

Read from the GCS's own tables through the connected driver: ``ray.nodes()`` (node id, alive,
head or worker, raylet socket) and the actor table (each Serve replica's node and PID). Ray's
state API (``ray.util.state``) serves the same tables over the dashboard's HTTP server, which the
embedded clusters of ``recallserve up`` do not start (``include_dashboard=False``), so the GCS
tables are read directly and the command works on any cluster the driver can join.

A raylet's PID is not in the GCS tables: it is found on this host as the ``raylet`` process whose
``--raylet_socket_name`` is the node's socket; a node on another host shows ``None``.
"""

from __future__ import annotations

from typing import Any

import ray

__all__ = ["cluster_status", "render_status"]

_HEAD_MARK = "node:__internal_head__"
_REPLICA_PREFIX = "SERVE_REPLICA::"


def _local_raylets() -> dict[str, int]:
    """Raylet socket path -> PID of every raylet process on this host."""
    import psutil

    out: dict[str, int] = {}
    for proc in psutil.process_iter(["name", "cmdline"]):
        try:
            if proc.info["name"] != "raylet":
                continue
            for arg in proc.info["cmdline"] or []:
                if arg.startswith("--raylet_socket_name="):
                    out[arg.split("=", 1)[1]] = proc.pid
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return out


def cluster_status() -> dict[str, list[dict[str, Any]]]:
    """``{"nodes": [...], "replicas": [...]}`` of the cluster this process is connected to.

    Nodes: ``node_id``, ``role`` (head / worker), ``address``, ``raylet_pid`` (None off this host),
    ``alive``, ``resources`` (the custom ones). Replicas (alive, restarting or pending; not those
    that ended): ``app``, ``deployment``, ``replica``, ``node_id``, ``pid``, ``state``.
    """
    raylets = _local_raylets()
    nodes = []
    for n in ray.nodes():
        res = n.get("Resources") or {}
        nodes.append({
            "node_id": n["NodeID"], "role": "head" if _HEAD_MARK in res else "worker",
            "address": n.get("NodeManagerAddress"), "raylet_pid": raylets.get(n.get("RayletSocketName", "")) if n["Alive"] else None,
            "alive": bool(n["Alive"]),
            "resources": {k: v for k, v in res.items() if k.startswith("recallserve_")},
        })
    replicas = []
    for actor in ray._private.state.actors().values():  # noqa: SLF001 - the GCS actor table (see the module docstring)
        name = actor.get("Name") or ""
        if not name.startswith(_REPLICA_PREFIX) or actor.get("State") == "DEAD":
            continue
        app, _, rest = name.removeprefix(_REPLICA_PREFIX).partition("#")
        deployment, _, replica = rest.partition("#")
        replicas.append({"app": app, "deployment": deployment, "replica": replica,
                         "node_id": (actor.get("Address") or {}).get("NodeID") or None,
                         "pid": actor.get("Pid") or None, "state": actor.get("State")})
    nodes.sort(key=lambda n: (n["role"] != "head", not n["alive"], n["node_id"]))
    replicas.sort(key=lambda r: (r["app"], r["deployment"], r["replica"]))
    return {"nodes": nodes, "replicas": replicas}


def render_status(status: dict[str, list[dict[str, Any]]]) -> str:
    """Two plain-text tables: nodes, then replicas (node ids shortened to 12 characters)."""
    lines = [f"{'NODE':<14}{'ROLE':<8}{'RAYLET PID':>11}  {'ALIVE':<6} RESOURCES"]
    for n in status["nodes"]:
        res = ", ".join(f"{k.removeprefix('recallserve_')}={v:g}" for k, v in sorted(n["resources"].items()))
        pid = "-" if n["raylet_pid"] is None else str(n["raylet_pid"])
        lines.append(f"{n['node_id'][:12]:<14}{n['role']:<8}{pid:>11}  {'yes' if n['alive'] else 'no':<6} {res}")
    lines += ["", f"{'APP':<14}{'DEPLOYMENT':<22}{'REPLICA':<12}{'NODE':<14}{'PID':>8}  STATE"]
    for r in status["replicas"]:
        node = (r["node_id"] or "-")[:12]
        lines.append(f"{r['app']:<14}{r['deployment']:<22}{r['replica'][:10]:<12}{node:<14}{r['pid'] or '-':>8}  {r['state']}")
    return "\n".join(lines)

#!/usr/bin/env bash
# Start `recallserve up` from this checkout on a scratch folder and port, run `recallserve bench search`
# against it through the Ray Serve proxy (once per argument group; groups are separated by `---`), then
# stop the cluster (SIGTERM to its PID). One Ray cluster per machine: run it under the Ray lock, e.g.
#   flock /tmp/recallserve-ray.lock loadtests/bench_search_cluster.sh SCRATCH -- --memories 2000 --out X.json
# SCRATCH holds the cluster's memory, state and Ray files (reused by a rerun: a seeded set is kept; the
# offline bulk seed `recallserve bench search-seed --config SCRATCH/profile.yaml` writes there too).
# Environment: PROFILE (default cpu-local), PORT (default 8731), KEYS ("key:tenant,..." added to the
# profile's API keys), WARM_S (most seconds to wait after ready for the agent's prompt warm-up, which
# keeps the reasoner busy; the wait ends once the reasoner replica is idle; default 300), PROFILE_ONLY (write the
# profile and exit), OVERRIDES (JSON of
# config sections merged over the profile's, e.g. '{"ray": {"haproxy_per_key_max": 0}}' for an A/B run).
set -euo pipefail
cd "$(dirname "$0")/.."
scratch=$(realpath -m "$1"); shift; [ "${1:-}" = "--" ] && shift
port=${PORT:-8731}; profile=${PROFILE:-cpu-local}
mkdir -p "$scratch"
python - "$profile" "$scratch" "$port" "${KEYS:-}" "${OVERRIDES:-{\}}" <<'PY'
import json, sys, yaml
from pathlib import Path
from recallserve.deployments.config import PROFILES_DIR
profile, scratch, port, keys = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
data = yaml.safe_load((PROFILES_DIR / f"{profile}.yaml").read_text())
for section, values in json.loads(sys.argv[5]).items():
    data[section] = {**data.get(section, {}), **values} if isinstance(values, dict) else values
data["server"] = {**data.get("server", {}), "host": "127.0.0.1", "port": port}
data["memory"] = {**data.get("memory", {}), "data_dir": str(scratch / "memory")}
data["state_dir"] = str(scratch / "state")
data["ray"] = {**data.get("ray", {}), "temp_dir": str(scratch / "ray")}
auth = data.setdefault("auth", {})
auth["keys"] = {**auth.get("keys", {}), **dict(kv.split(":", 1) for kv in keys.split(",") if kv)}
(scratch / "profile.yaml").write_text(yaml.safe_dump(data))
PY
# PROFILE_ONLY=1: write SCRATCH/profile.yaml and stop (for an offline `recallserve bench search-seed` before the run).
[ -n "${PROFILE_ONLY:-}" ] && exit 0
log="$scratch/up.log"
# NOTE: the installed package (`pip install -e .` of this checkout), run with this python.
cli=(-m recallserve.deployments.cli)
python "${cli[@]}" up --config "$scratch/profile.yaml" >"$log" 2>&1 &
up=$!
trap 'kill -TERM $up 2>/dev/null || true; for _ in $(seq 60); do kill -0 $up 2>/dev/null || break; sleep 1; done; kill -KILL $up 2>/dev/null || true' EXIT
for _ in $(seq 450); do
  grep -q "ready in" "$log" && break
  kill -0 $up 2>/dev/null || { echo "recallserve up exited:"; tail -30 "$log"; exit 1; }
  sleep 2
done
grep "ready in" "$log"
python - "${WARM_S:-300}" <<'PY'
import sys, time, psutil
deadline = time.monotonic() + float(sys.argv[1])
procs = [p for p in psutil.process_iter(["cmdline"]) if (p.info["cmdline"] or [""])[0].startswith("ray::ServeReplica") and "reasoner" in p.info["cmdline"][0]]
def busy() -> float:
    t0 = sum(p.cpu_times().user + p.cpu_times().system for p in procs); time.sleep(5)
    return (sum(p.cpu_times().user + p.cpu_times().system for p in procs) - t0) / 5
while time.monotonic() < deadline and (share := busy()) > 0.05:
    print(f"reasoner still warming up ({share:.2f} cores)", flush=True)
print("warm-up over" if time.monotonic() < deadline else "warm-up wait ran out", flush=True)
PY
uptime
args=()
for a in "$@" ---; do
  if [ "$a" = "---" ]; then
    python "${cli[@]}" bench search --url "http://127.0.0.1:$port" "${args[@]}"; uptime; args=()
  else
    args+=("$a")
  fi
done

#!/usr/bin/env bash
# Start `recallserve up` from this checkout on a scratch folder and port, run `recallserve bench search`
# against it through the Ray Serve proxy, then stop the cluster (SIGTERM to its PID). One Ray cluster per
# machine: run it under the Ray lock, e.g.
#   flock /tmp/recallserve-ray.lock loadtests/bench_search_cluster.sh SCRATCH -- --memories 2000 --out X.json
# SCRATCH holds the cluster's memory, state and Ray files (reused by a rerun: the seeded set is kept).
# Environment: PROFILE (default cpu-local), PORT (default 8731), SEED_CMD (run after the copy of the
# profile is written and before `up`, e.g. the offline bulk seed), WARM_S (seconds to wait after ready for
# the agent's prompt warm-up, default 60).
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD
scratch=$(realpath -m "$1"); shift; [ "${1:-}" = "--" ] && shift
port=${PORT:-8731}; profile=${PROFILE:-cpu-local}
mkdir -p "$scratch"
python - "$profile" "$scratch" "$port" <<'PY'
import sys, yaml
from pathlib import Path
from deployments.config import PROFILES_DIR
profile, scratch, port = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
data = yaml.safe_load((PROFILES_DIR / f"{profile}.yaml").read_text())
data["server"] = {**data.get("server", {}), "host": "127.0.0.1", "port": port}
data["memory"] = {**data.get("memory", {}), "data_dir": str(scratch / "memory")}
data["state_dir"] = str(scratch / "state")
data["ray"] = {**data.get("ray", {}), "temp_dir": str(scratch / "ray")}
(scratch / "profile.yaml").write_text(yaml.safe_dump(data))
PY
if [ -n "${SEED_CMD:-}" ]; then bash -c "$SEED_CMD"; fi
log="$scratch/up.log"
python -c "import sys; from deployments.cli import main; sys.exit(main(sys.argv[1:]))" up --config "$scratch/profile.yaml" >"$log" 2>&1 &
up=$!
trap 'kill -TERM $up 2>/dev/null || true; for _ in $(seq 60); do kill -0 $up 2>/dev/null || break; sleep 1; done; kill -KILL $up 2>/dev/null || true' EXIT
for _ in $(seq 300); do
  grep -q "ready in" "$log" && break
  kill -0 $up 2>/dev/null || { echo "recallserve up exited:"; tail -30 "$log"; exit 1; }
  sleep 2
done
grep "ready in" "$log"
sleep "${WARM_S:-60}"
uptime
python -c "import sys; from deployments.cli import main; sys.exit(main(sys.argv[1:]))" bench search --url "http://127.0.0.1:$port" "$@"
uptime

#!/usr/bin/env bash
# Search at scale through the cluster (issue 43): N memories in one tenant, bulk-loaded offline, then
# `recallserve up` on them and `recallserve bench search` at 1 and 16 clients.
#   loadtests/scale_search.sh SCRATCH N [OUT_PREFIX]     e.g. loadtests/scale_search.sh /tmp/scale-100k 100000
#   TENANTS=10000 loadtests/scale_search.sh SCRATCH 100   10,000 tenants of 100 each; the bench searches one of them
#   SEEDED=1 ...  SCRATCH was seeded already (this script's seed step run on its own): start the cluster on it
# How the vectors are loaded: `recallserve bench search-seed` embeds 2,000 base ticket texts with the profile's
# embedder and writes N rows (a base vector plus Gaussian noise, sigma 0.2, re-normalised; the text of its base)
# straight into the stopped cluster's shard folders, as the shard's own WAL and snapshot writer does.
# Figures: the ready time of `up` with N memories on disk (restart time), the shard replicas' resident memory
# after start (bytes per memory = RSS / N, beside the same figure of an empty cluster in the report's note),
# search p50/p95 per client level. A first 60 s level at 1 client warms the index (above
# memory.shard.exact_max_rows live rows the shard trains its IVF lists in the background on the first search;
# until then it scans exactly). One Ray cluster per machine: run it under the Ray lock.
set -euo pipefail
cd "$(dirname "$0")/.."
scratch=$(realpath -m "$1"); n=$2; out=${3:-loadtests/results/scale-search-$n${TENANTS:+x$TENANTS}}
export PORT=${PORT:-8741} WARM_S=${WARM_S:-30}
if [ -z "${SEEDED:-}" ]; then
rm -rf "$scratch"; mkdir -p "$scratch"
PROFILE_ONLY=1 loadtests/bench_search_cluster.sh "$scratch"
t0=$(date +%s.%N)
python -m recallserve.deployments.cli bench search-seed --config "$scratch/profile.yaml" --memories "$n" --tag scale \
  --tenants "${TENANTS:-1}"
echo "seeded $n x ${TENANTS:-1} in $(python -c "print(round($(date +%s.%N) - $t0, 1))") s"
fi
du -sh "$scratch/memory"
# NOTE: resident memory of the shard replicas, sampled every 2 s while the bench runs (the largest sum).
python - "$scratch/rss.json" <<'PY' &
import json, sys, time, psutil
best, deadline = 0, time.monotonic() + 3600
while time.monotonic() < deadline:
    shards = [p for p in psutil.process_iter(["cmdline"]) if "shard" in ((p.info["cmdline"] or [""])[0]).lower()
              and (p.info["cmdline"] or [""])[0].startswith("ray::")]
    try:
        best = max(best, sum(p.memory_info().rss for p in shards))
    except psutil.Error:
        pass
    with open(sys.argv[1], "w") as f:
        json.dump({"shard_rss_bytes_max": best, "processes": len(shards)}, f)
    time.sleep(2)
PY
sampler=$!
trap 'kill $sampler 2>/dev/null || true' EXIT
loadtests/bench_search_cluster.sh "$scratch" -- --memories "$n" --tag scale --clients 1 --seconds 60 --out "$scratch/warm.json" \
  --- --memories "$n" --tag scale --clients 1,16 --seconds 20 --out "$out.json"
grep "ready in" "$scratch/up.log"
cat "$scratch/rss.json"; echo

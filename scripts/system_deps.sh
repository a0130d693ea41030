#!/usr/bin/env bash
# The system packages the test suite needs, from Debian's archive, installed only when missing (as root):
#   chromium        the console's browser tests
#   postgresql      the cluster state store's tests start their own server (initdb + pg_ctl, loopback)
#   redis-server    the GCS fault-tolerance tests start their own Redis (loopback)
# Idempotent: a machine that has them all runs no apt at all.
set -euo pipefail
need=()
command -v chromium >/dev/null || need+=(chromium)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
command -v redis-server >/dev/null || need+=(redis-server)
if [ "${#need[@]}" -gt 0 ]; then
    echo "system_deps: installing ${need[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"
fi

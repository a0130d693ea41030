#!/usr/bin/env bash
# The system packages the test suite needs, from Debian's archive, installed only when missing (as root):
#   chromium        the console's browser tests
#   postgresql      the cluster state store's tests start their own server (initdb + pg_ctl, loopback)
#   redis-server    the GCS fault-tolerance tests start their own Redis (loopback)
#   nodejs + npm    the official TypeScript MCP SDK as a client of /mcp (tests/mcp_node, its lockfile)
# Idempotent: a machine that has them all runs no apt at all.
set -euo pipefail
need=()
command -v chromium >/dev/null || need+=(chromium)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
command -v redis-server >/dev/null || need+=(redis-server)
command -v node >/dev/null || need+=(nodejs)
command -v npm >/dev/null || need+=(npm)
if [ "${#need[@]}" -gt 0 ]; then
    echo "system_deps: installing ${need[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"
fi
# The TypeScript MCP SDK at the lockfile's versions (npm's cache first; a no-op once installed).
node_dir="$(dirname "$0")/../tests/mcp_node"
if [ ! -d "$node_dir/node_modules/@modelcontextprotocol/sdk" ]; then
    npm ci --prefix "$node_dir" --prefer-offline --no-audit --no-fund
fi

#!/usr/bin/env bash
# Prefect server + a process work pool for the deployments of deploy/prefect.yaml.
#   deploy/prefect/work-pool.sh server     # on the server machine (UI at http://HOST:4200)
#   export PREFECT_API_URL=http://HOST:4200/api    # everywhere else
#   deploy/prefect/work-pool.sh deploy     # create the pool, register the deployments
#   deploy/prefect/work-pool.sh worker     # on each machine that runs flows
set -euo pipefail
cd "$(dirname "$0")/../.."
PREFECT=.venv/bin/prefect
POOL=${POOL:-shardflow}
case "${1:-}" in
  server) exec "$PREFECT" server start --host 0.0.0.0 --port "${PORT:-4200}" ;;
  deploy)
    "$PREFECT" work-pool inspect "$POOL" >/dev/null 2>&1 || "$PREFECT" work-pool create "$POOL" --type process
    # From deploy/: the paths in prefect.yaml are relative to it, and prefect deploy records it as
    # the workers' working directory.
    (cd deploy && "../$PREFECT" deploy --all) ;;
  worker) exec "$PREFECT" worker start --pool "$POOL" ;;
  *) echo "usage: $0 server | deploy | worker" >&2; exit 2 ;;
esac

#!/usr/bin/env bash
# A Ray cluster by hand (what deploy/ray/cluster.yaml does through `ray up`).
#   deploy/ray/start.sh head                 # on the head machine
#   deploy/ray/start.sh worker HEAD_IP       # on every other machine
# Then point shardflow at it: export RAY_ADDRESS=HEAD_IP:6379, and plan with --backend ray.
set -euo pipefail
cd "$(dirname "$0")/../.."
RAY=.venv/bin/ray
PORT=${RAY_PORT:-6379}
case "${1:-}" in
  head)   "$RAY" start --head --port="$PORT" --dashboard-host=0.0.0.0 ;;
  worker) "$RAY" start --address="${2:?usage: start.sh worker HEAD_IP}:$PORT" ;;
  stop)   "$RAY" stop ;;
  *)      echo "usage: $0 head | worker HEAD_IP | stop" >&2; exit 2 ;;
esac

#!/usr/bin/env bash
# An MLflow tracking server for shardflow runs shared by several machines.
#   deploy/mlflow/server.sh                       # SQLite + local artifacts, port 5000
#   BACKEND=postgresql://mlflow:...@db/mlflow ARTIFACTS=s3://bucket/mlflow deploy/mlflow/server.sh
# Clients: export MLFLOW_TRACKING_URI=http://THIS_HOST:5000 (flows, shardflow compare/train
# --plan-id). Artifacts go through the server (--serve-artifacts): clients need no S3 credentials.
set -euo pipefail
cd "$(dirname "$0")/../.."
exec .venv/bin/mlflow server \
  --backend-store-uri "${BACKEND:-sqlite:///mlflow-server.db}" \
  --artifacts-destination "${ARTIFACTS:-./mlflow-artifacts}" \
  --serve-artifacts \
  --host 0.0.0.0 --port "${PORT:-5000}" \
  --allowed-hosts "${ALLOWED_HOSTS:-localhost,127.0.0.1,10.*,192.168.*}"

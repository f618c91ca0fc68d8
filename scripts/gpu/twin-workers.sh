#!/usr/bin/env bash
# After twin-c64.sh, on its stack still up (the gateways on :8031-8033 included), detached
# from the repository root on the host:
#
#   setsid nohup bash scripts/gpu/twin-workers.sh /root/sg/results/rw > /root/sg/rw.log 2>&1 &
#
# In twin-c64.sh's c=64 waves the adaptive gateway in 4 worker processes (adaptive-w4,
# bench.gateway_workers) ran 0.93x plain against one process's 0.90x (the bare relay 0.98x).
# Each worker sees only its own requests in flight, besides the backends' scraped batch:
# does it still route at c = 1-8, where the load decides between EAGLE-3 and plain? One
# repeat of twin-run.sh's measurement (every backend, c = 1 to 64, PER_TASK=12) with
# adaptive-quiet (one process, :8032) and adaptive-w4 beside the others.
set -uo pipefail
OUT=${1:?OUT}
mkdir -p "$OUT"
source scripts/gpu/twin-env.sh
bash scripts/gpu/stack.sh claim $$ || exit 1
trap 'bash scripts/gpu/stack.sh release $$' EXIT
python3 -m bench.speedup --config /root/sg/gpu-static.yaml --gateway http://127.0.0.1:8010 \
    --adaptive --adaptive-gateway http://127.0.0.1:8000 \
    --extra-gateway adaptive-quiet=http://127.0.0.1:8032 \
    --extra-gateway "adaptive-w${WORKERS:-4}=http://127.0.0.1:8033" \
    --prompts .gpu/prompts --per-task "${PER_TASK:-12}" --max-tokens 64 \
    --concurrency 1,4,8,16,32,64 --warmup 10 --settle 0.05 --order-seed "${ORDER_SEED:-0}" \
    --out "$OUT/speedup" \
    > "$OUT/speedup.log" 2>&1
curl -s localhost:8000/routes > "$OUT/routes-adaptive.json" || true
curl -s localhost:8033/routes > "$OUT/routes-w4.json" || true
date +%s > "$OUT/done"

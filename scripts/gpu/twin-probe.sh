#!/usr/bin/env bash
# Session 15's host run (docs/benchmarks.md section 7, "Seventh run (session 15)"), after
# `stack.sh install-b`, detached from the repository root on the host:
#
#   setsid nohup bash scripts/gpu/twin-probe.sh /root/sg/results > /root/sg/twin-probe.log 2>&1 &
#
# twin-run.sh's three repeats (PER_TASK=12, no checks, no sampled step, no draft-model
# stack), then, with the stack still up: bench.wave_probe beside a bench.wave_marks gateway
# (:8040, the same config, state not saved) on the plain server, then bench.sim_fleet on the
# host's CPUs (8 simulated GPUs x plain, EAGLE-3). OUT/t6 and OUT/t7 hold when each ended.
set -uo pipefail
OUT=${1:?OUT}
bash scripts/gpu/stack.sh claim $$ || exit 1 # the probe and the fleet after twin-run.sh too
trap 'bash scripts/gpu/stack.sh release $$' EXIT
PER_TASK=12 CHECKS=0 SAMPLED=0 DRAFT_CONFIG= CONFIG=config/gpu-twin.yaml \
    bash scripts/gpu/twin-run.sh "$OUT" || exit 1
export PYTHONPATH=/root/sg/site:$PWD SPECGATE_CACHE_DIR=/root/sg/cache
mkdir -p "$OUT/probe"
SPECGATE_PORT=8040 SPECGATE_STATE_PERSIST=false MARKS=$OUT/probe/marks.json \
    python3 -m bench.wave_marks serve --config config/gpu-twin.yaml \
    > "$OUT/probe/gw.log" 2>&1 < /dev/null &
marks=$!
for _ in $(seq 60); do curl -sf localhost:8040/ready > /dev/null && break; sleep 1; done
python3 -m bench.wave_probe --direct http://127.0.0.1:8001 --gateway http://127.0.0.1:8040 \
    --model smollm2-twin --prompts .gpu/prompts --out "$OUT/probe/sent.json" \
    > "$OUT/probe/probe.log" 2>&1
kill -TERM "$marks"; sleep 5
date +%s > "$OUT/t6"
python3 -m bench.sim_fleet --gpus 8 --kinds plain,eagle3 --concurrency 32,128,256 --per-task 64 \
    --warmup 10 --scale 10 --prompts .gpu/prompts --out "$OUT/fleet" > "$OUT/fleet.log" 2>&1
date +%s > "$OUT/t7"

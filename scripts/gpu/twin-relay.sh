#!/usr/bin/env bash
# Session 18's host run (docs/benchmarks.md section 7, "Ninth run (session 18)"), after
# `stack.sh install-b` with a bundle that carries vllm-router, detached from the repository
# root on the host:
#
#   setsid nohup bash scripts/gpu/twin-relay.sh /root/sg/results > /root/sg/twin-relay.log 2>&1 &
#
# Is the first-token gap of the gateways at c=32-64 (every request on plain, yet 0.89-0.94x
# plain in the eighth run) specgate's own work, or what any relay in front of vLLM costs in a
# burst? Two relays in front of the plain twin server are measured beside the others, waves
# interleaved: `bare` (bench.bare_proxy on :8040, specgate's stack, uvicorn and aiohttp, with
# no work of its own) and `vllm-router` (vllm-router from PyPI, Rust, round robin over plain
# alone, :8050). Then twin-run.sh's three repeats (PER_TASK=12, no checks, no sampled step, no
# draft-model stack). The relays start once plain answers (`stack.sh relays`, in the
# background while twin-run.sh starts the stack and waits for the gateways).
set -uo pipefail
OUT=${1:?OUT}
mkdir -p "$OUT"
bash scripts/gpu/stack.sh claim $$ || exit 1 # before the relays start
trap 'bash scripts/gpu/stack.sh release $$' EXIT
bash scripts/gpu/stack.sh relays "$OUT" > "$OUT/relays.log" 2>&1 < /dev/null &
RELAYS="bare=http://127.0.0.1:8040 vllm-router=http://127.0.0.1:8050" PER_TASK=12 CHECKS=0 \
    SAMPLED=0 DRAFT_CONFIG= CONFIG=config/gpu-twin.yaml bash scripts/gpu/twin-run.sh "$OUT"

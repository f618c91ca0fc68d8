#!/usr/bin/env bash
# The next host run for the c=64 question of docs/benchmarks.md section 7 ("Ninth run
# (session 18)"), after `stack.sh install-b`, detached from the repository root on the host:
#
#   setsid nohup bash scripts/gpu/twin-c64.sh /root/sg/results > /root/sg/twin-c64.log 2>&1 &
#
# In the ninth run, with every request on plain, the adaptive gateway ran c=64 at 0.89x plain
# (five runs, 0.88-0.92) where the static one ran 0.94x and bench.bare_proxy 0.96x. The
# adaptive gateway there was `specgate up` (the servers' supervisor in the same process),
# saved its learnt state and ran the distribution canary; the static one was `gateway serve`
# with neither. This run separates them on the same servers, waves interleaved: beside
# plain, static (:8010), adaptive (`up`, :8000) and the two relays (`stack.sh relays`), two more
# adaptive gateways on the same config, both `gateway serve`: adaptive-serve (:8031, state
# saved to a file of its own, canary on, as `up`'s) and adaptive-quiet (:8032, neither).
# And is a burst's intake in one event loop the relays' common cost at c=64? Two targets take
# it in WORKERS processes (default 4): bench.gateway_workers (adaptive-w4, :8033, as
# adaptive-quiet) and bench.bare_proxy --workers (relay-bare-w4, :8041).
# Then bench.speedup on plain alone and those targets at c = 16, 32, 64, PER_TASK=32, RUNS
# times (default 5): OUT/hiN/speedup.
set -uo pipefail
source scripts/gpu/twin-start.sh "${1:?OUT}" || exit 1
SPECGATE_PORT=8031 SPECGATE_STATE_FILE=/root/sg/state-8031.json \
    python3 -m gateway serve --config "$CONFIG" > "$OUT/serve.log" 2>&1 < /dev/null &
SPECGATE_PORT=8032 SPECGATE_STATE_PERSIST=false SPECGATE_SAMPLE_CANARY_INTERVAL_S=0 \
    python3 -m gateway serve --config "$CONFIG" > "$OUT/quiet.log" 2>&1 < /dev/null &
W=${WORKERS:-4}
SPECGATE_PORT=8033 SPECGATE_STATE_PERSIST=false SPECGATE_SAMPLE_CANARY_INTERVAL_S=0 \
    SPECGATE_CONFIG="$CONFIG" python3 -m bench.gateway_workers --workers "$W" \
    > "$OUT/workers.log" 2>&1 < /dev/null &
python3 -m bench.bare_proxy --upstream http://127.0.0.1:8001 --port 8041 --workers "$W" \
    > "$OUT/bare-w.log" 2>&1 < /dev/null &
for port in 8031 8032 8033 8041; do
    for _ in $(seq 60); do
        curl -sf "localhost:$port/ready" > /dev/null || curl -sf "localhost:$port/health" \
            > /dev/null && break
        sleep 1
    done
done
date +%s > "$OUT/t0"
for n in $(seq "${RUNS:-5}"); do
    python3 -m bench.speedup --config /root/sg/gpu-static.yaml --gateway http://127.0.0.1:8010 \
        --adaptive --adaptive-gateway http://127.0.0.1:8000 \
        --extra-gateway adaptive-serve=http://127.0.0.1:8031 \
        --extra-gateway adaptive-quiet=http://127.0.0.1:8032 \
        --extra-gateway adaptive-w$W=http://127.0.0.1:8033 \
        --relay bare=http://127.0.0.1:8040 --relay vllm-router=http://127.0.0.1:8050 \
        --relay bare-w$W=http://127.0.0.1:8041 \
        --backends plain --prompts .gpu/prompts --per-task "${PER_TASK:-32}" --max-tokens 64 \
        --concurrency 16,32,64 --warmup 10 --settle 0.05 --order-seed "$n" \
        --out "$OUT/hi$n/speedup" \
        > "$OUT/hi$n.log" 2>&1
    date +%s > "$OUT/t$n"
done

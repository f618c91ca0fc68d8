#!/usr/bin/env bash
# The next host run for the tenth run's open half (docs/benchmarks.md section 7, "Tenth run"):
# at c=64, every request on plain, the gateways' first token came 56-68 ms after plain's, and
# only about half of that is the burst entering the gateway 0.5-1.0 ms apart. Where does the
# rest go, after entry? After `stack.sh install-b`, detached from the repository root:
#
#   setsid nohup bash scripts/gpu/twin-marks.sh /root/sg/results > /root/sg/twin-marks.log 2>&1 &
#
# The twin's stack (no repeats), then bench.wave_probe (waves of N at once, direct to plain
# and through a bench.wave_marks gateway, :8060, the adaptive config, state not saved, canary
# off, alternating) at N = 64 and 48, each analysed with the gateway's marks: when requests
# entered, their prepare stage, when plain's headers and first chunk came back. Then five
# short runs (bench.speedup --backends plain, c = 16, 32, 64, the bare relay beside, each run
# its own --order-seed). OUT/probe{64,48}/, OUT/hiN/speedup; OUT/tN when each part ended.
set -uo pipefail
source scripts/gpu/twin-start.sh "${1:?OUT}" || exit 1
date +%s > "$OUT/t0"
for n in 64 48; do
    mkdir -p "$OUT/probe$n"
    SPECGATE_PORT=8060 SPECGATE_STATE_PERSIST=false SPECGATE_SAMPLE_CANARY_INTERVAL_S=0 \
        MARKS=$OUT/probe$n/marks.json python3 -m bench.wave_marks serve --config "$CONFIG" \
        > "$OUT/probe$n/gw.log" 2>&1 < /dev/null &
    marks=$!
    for _ in $(seq 60); do curl -sf localhost:8060/ready > /dev/null && break; sleep 1; done
    python3 -m bench.wave_probe --direct http://127.0.0.1:8001 --gateway http://127.0.0.1:8060 \
        --model smollm2-twin --prompts .gpu/prompts --n "$n" --out "$OUT/probe$n/sent.json" \
        > "$OUT/probe$n/probe.log" 2>&1
    kill -TERM "$marks"; wait "$marks"
    python3 -m bench.wave_probe --analyse "$OUT/probe$n/sent.json" \
        --marks "$OUT/probe$n/marks.json" > "$OUT/probe$n/analysis.md" 2>&1
done
date +%s > "$OUT/t1"
for n in $(seq "${RUNS:-5}"); do
    python3 -m bench.speedup --config /root/sg/gpu-static.yaml --gateway http://127.0.0.1:8010 \
        --adaptive --adaptive-gateway http://127.0.0.1:8000 \
        --relay bare=http://127.0.0.1:8040 --backends plain --prompts .gpu/prompts \
        --per-task 32 --max-tokens 64 --concurrency 16,32,64 --warmup 10 --settle 0.05 \
        --order-seed "$n" --out "$OUT/hi$n/speedup" > "$OUT/hi$n.log" 2>&1
    date +%s > "$OUT/t$((n + 1))"
done

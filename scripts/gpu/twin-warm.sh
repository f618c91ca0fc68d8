#!/usr/bin/env bash
# The eleventh run (docs/benchmarks.md section 7): does a burst that finds no idle pooled
# connection to plain make up the half of the c=64 gap that builds after entry? After
# `stack.sh install-b`, detached from the repository root on the host:
#
#   setsid nohup bash scripts/gpu/twin-warm.sh /root/sg/results > /root/sg/twin-warm.log 2>&1 &
#
# The gateway keeps an idle connection to a backend 4 s (below vLLM's 5 s idle timeout), and
# bench.speedup's waves reach one gateway ~5 s apart, so every wave connects first; on the
# host's Python 3.12 a request on a pooled connection leaves within its prepare step, one
# that connects only after the burst's last prepare (on this machine, Python 3.12, waves of
# 64 five seconds apart against bench.fake_upstream: first token p50 +47 ms over direct
# at 4 s, +21 ms at 60 s). `specgate up` now launches the servers keeping idle connections
# 65 s (VLLM_HTTP_TIMEOUT_KEEP_ALIVE) and keeps its own 60 s (cli/launch.py); beside plain,
# static (:8010, `gateway serve`, 4 s), adaptive (`up`, :8000, 60 s) and the bare relay
# (:8040), three more `gateway serve` on the adaptive config, state not saved,
# canary off: adaptive-quiet (:8032, keep-alive 4 s), adaptive-warm (:8034,
# SPECGATE_BACKEND_KEEP_ALIVE_S=60) and adaptive-turns (:8035, gateway/ of e8ede40 from
# TURNS, default .gpu/turns, first on the path: one prepare per loop turn, keep-alive 4 s).
#   1. bench.wave_probe, waves of 64 five seconds apart (past the 4 s keep-alive), direct and
#      through a bench.wave_marks gateway (:8060) keeping connections 4 s, then 60 s:
#      OUT/probe-4s/, OUT/probe-60s/;
#   2. RUNS (default 4) short runs, bench.speedup --backends plain, c = 16, 32, 64,
#      PER_TASK=32, order seed n: OUT/hiN/speedup (a variant that did not start is left out);
#   3. one full repeat (every backend, c = 1 to 64, PER_TASK=12, order seed 11) with
#      adaptive-warm beside the others: OUT/rw/speedup.
set -uo pipefail
source scripts/gpu/twin-start.sh "${1:?OUT}" || exit 1
QUIET=(SPECGATE_STATE_PERSIST=false SPECGATE_SAMPLE_CANARY_INTERVAL_S=0)
env "${QUIET[@]}" SPECGATE_PORT=8032 python3 -m gateway serve --config "$CONFIG" \
    > "$OUT/quiet.log" 2>&1 < /dev/null &
env "${QUIET[@]}" SPECGATE_PORT=8034 SPECGATE_BACKEND_KEEP_ALIVE_S=60 \
    python3 -m gateway serve --config "$CONFIG" > "$OUT/warm.log" 2>&1 < /dev/null &
env "${QUIET[@]}" SPECGATE_PORT=8035 PYTHONSAFEPATH=1 \
    PYTHONPATH="${TURNS:-$PWD/.gpu/turns}:$PYTHONPATH" \
    python3 -m gateway serve --config "$CONFIG" > "$OUT/turns.log" 2>&1 < /dev/null &
ready() {
    for _ in $(seq 60); do curl -sf "localhost:$1/ready" > /dev/null && return 0; sleep 1; done
    echo "twin-warm: nothing ready on :$1" >&2
    return 1
}
GATEWAYS=()
for variant in quiet=8032 warm=8034 turns=8035; do
    name=${variant%=*} port=${variant#*=}
    ready "$port" && GATEWAYS+=(--extra-gateway "adaptive-$name=http://127.0.0.1:$port")
done
date +%s > "$OUT/t0"
for keep in 4 60; do
    P=$OUT/probe-${keep}s
    mkdir -p "$P"
    env "${QUIET[@]}" SPECGATE_PORT=8060 SPECGATE_BACKEND_KEEP_ALIVE_S=$keep \
        MARKS="$P/marks.json" python3 -m bench.wave_marks serve --config "$CONFIG" \
        > "$P/gw.log" 2>&1 < /dev/null &
    marks=$!
    ready 8060 &&
        python3 -m bench.wave_probe --direct http://127.0.0.1:8001 --gateway http://127.0.0.1:8060 \
            --model smollm2-twin --prompts .gpu/prompts --n 64 --waves 4 --gap 5 \
            --out "$P/sent.json" > "$P/probe.log" 2>&1
    kill -TERM "$marks"
    wait "$marks"
    python3 -m bench.wave_probe --analyse "$P/sent.json" --marks "$P/marks.json" \
        > "$P/analysis.md" 2>&1
done
date +%s > "$OUT/t1"
for n in $(seq "${RUNS:-4}"); do
    python3 -m bench.speedup --config /root/sg/gpu-static.yaml --gateway http://127.0.0.1:8010 \
        --adaptive --adaptive-gateway http://127.0.0.1:8000 "${GATEWAYS[@]}" \
        --relay bare=http://127.0.0.1:8040 --backends plain --prompts .gpu/prompts \
        --per-task "${PER_TASK:-32}" --max-tokens 64 --concurrency 16,32,64 --warmup 10 \
        --settle 0.05 --order-seed "$n" --out "$OUT/hi$n/speedup" > "$OUT/hi$n.log" 2>&1
    date +%s > "$OUT/t$((n + 1))"
done
mkdir -p "$OUT/rw"
WARM=()
ready 8034 && WARM=(--extra-gateway adaptive-warm=http://127.0.0.1:8034)
python3 -m bench.speedup --config /root/sg/gpu-static.yaml --gateway http://127.0.0.1:8010 \
    --adaptive --adaptive-gateway http://127.0.0.1:8000 "${WARM[@]}" \
    --prompts .gpu/prompts --per-task 12 --max-tokens 64 --concurrency 1,4,8,16,32,64 \
    --warmup 10 --settle 0.05 --order-seed 11 --out "$OUT/rw/speedup" > "$OUT/rw.log" 2>&1
curl -s localhost:8000/routes > "$OUT/rw/routes-adaptive.json" || true
curl -s localhost:8034/routes > "$OUT/rw/routes-warm.json" || true
date +%s > "$OUT/done"

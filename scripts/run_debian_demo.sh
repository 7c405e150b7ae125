#!/usr/bin/env bash
# CPU-scale demonstration on the Debian UI de-en corpus: a 6+6-layer Post-LN Transformer trained
# with Adam and NO warmup, with and without GradInit, versus the same model with warmup.
# Usage: scripts/run_debian_demo.sh DATA_BIN OUT_DIR [ARM ...]
#   arms: xavier-s1 xavier-s2 gradinit-s1 gradinit-s2 warmup-s1 (default: all, in an order that
#   gives one run of each kind first). Each run writes OUT_DIR/ARM/train.log.
set -euo pipefail
DATA=${1:?usage: $0 DATA_BIN OUT_DIR [ARM ...]}
OUT=${2:?usage: $0 DATA_BIN OUT_DIR [ARM ...]}
shift 2
ARMS=("$@")
[ ${#ARMS[@]} -gt 0 ] || ARMS=(gradinit-s1 xavier-s1 warmup-s1 gradinit-s2 xavier-s2)
REPO=$(cd "$(dirname "$0")/.." && pwd)
LR=${LR:-1e-3}              # = the paper's 5e-4 at d=512, scaled by sqrt(512/128) (Adam's step vs weight scale)
UPDATES=${UPDATES:-600}
VALID_EVERY=${VALID_EVERY:-100}
WARMUP=${WARMUP:-200}
GI_ITERS=${GI_ITERS:-200}
GI_LR=${GI_LR:-1e-2}
GI_GAMMA=${GI_GAMMA:-}       # GradInit's gamma; empty: the rule of thumb eta*gamma = 0.1 (Adam)
GI_ETA=${GI_ETA:-}           # GradInit's eta; empty: the training lr
GI_ADAM_STATE=${GI_ADAM_STATE:-shared}  # moments of the scales' Adam: shared or per_branch
MAX_TOKENS=${MAX_TOKENS:-4096}
GI_LOG=${GI_LOG:-10}
BLEU=${BLEU:-1}              # 0: skip the test-set BLEU evaluation (beam 5 is slow on CPU)
CPU=${CPU:-1}                # 0: train, run GradInit and generate on the GPU (fairseq's default device)
REF=${REF:-}                 # raw reference file for BLEU (e.g. ../shared/data/debian-ui-de-en/test.en)
PARALLEL=${PARALLEL:-0}      # 1: run the arms at once (one GPU holds several of these small models)
EXTRA_ARGS=${EXTRA_ARGS:-}   # more fairseq-train arguments for every arm, e.g. "--stop-time-hours 0.12"
read -r -a EXTRA <<< "$EXTRA_ARGS"
DEVICE_ARGS=()
[ "$CPU" = 0 ] || DEVICE_ARGS=(--cpu)

MODEL=(--arch transformer_iwslt_de_en --encoder-layers 6 --decoder-layers 6
  --encoder-embed-dim 128 --decoder-embed-dim 128 --encoder-ffn-embed-dim 512 --decoder-ffn-embed-dim 512
  --encoder-attention-heads 4 --decoder-attention-heads 4 --share-all-embeddings --dropout 0.3
  --criterion label_smoothed_cross_entropy --label-smoothing 0.1
  --optimizer adam --adam-betas "(0.9, 0.98)" --lr "$LR" --lr-scheduler fixed
  --max-tokens "$MAX_TOKENS" --max-update "$UPDATES" --validate-interval-updates "$VALID_EVERY" --validate-interval 1000
  --save-interval-updates 0 --no-epoch-checkpoints --keep-last-epochs 1
  "${DEVICE_ARGS[@]}" --num-workers 0 --log-format simple --log-interval 50 --no-progress-bar)

run_arm() {
  local arm=$1 seed=${1##*-s} extra=()
  case "$arm" in
    xavier-s*) ;;
    warmup-s*) extra=(--warmup-updates "$WARMUP") ;;
    gradinit-s*) extra=(--gradinit-iters "$GI_ITERS" --gradinit-lr "$GI_LR" --gradinit-max-tokens "$MAX_TOKENS"
                        --gradinit-log-interval "$GI_LOG" --gradinit-adam-state "$GI_ADAM_STATE"
                        ${GI_GAMMA:+--gradinit-gamma "$GI_GAMMA"} ${GI_ETA:+--gradinit-eta "$GI_ETA"}) ;;
  esac
  local dir="$OUT/$arm"
  mkdir -p "$dir"
  echo "[$(date +%T)] $arm -> $dir"
  (cd "$REPO" && fairseq-train "$DATA" --user-dir fairseq_gradinit --task translation_gradinit "${MODEL[@]}" \
      --seed "$seed" --save-dir "$dir" "${extra[@]}" "${EXTRA[@]}") > "$dir/train.log" 2>&1 \
    || { echo "training failed for $arm (see $dir/train.log)"; return 1; }
  [ "$BLEU" = 0 ] && return 0
  python "$REPO/scripts/evaluate_bleu.py" "$DATA" --path "$dir/checkpoint_last.pt" --user-dir "$REPO/fairseq_gradinit" \
      --output-json "$dir/bleu.json" "${DEVICE_ARGS[@]}" ${REF:+--ref "$REF"} > "$dir/bleu.log" 2>&1 \
    || echo "BLEU evaluation failed for $arm (see $dir/bleu.log)"
}

for arm in "${ARMS[@]}"; do
  case "$arm" in xavier-s*|warmup-s*|gradinit-s*) ;; *) echo "unknown arm $arm" >&2; exit 2 ;; esac
done
status=0
if [ "$PARALLEL" = 1 ]; then
  pids=()
  for arm in "${ARMS[@]}"; do run_arm "$arm" & pids+=($!); done
  for pid in "${pids[@]}"; do wait "$pid" || status=1; done
else
  for arm in "${ARMS[@]}"; do run_arm "$arm" || status=1; done
fi
exit $status

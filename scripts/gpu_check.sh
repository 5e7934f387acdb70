#!/usr/bin/env bash
# On the lent GPU: the GPU test suite, then end-to-end benchmarks on random-weight models of real
# architectures. Results (JSON + logs) go to $OUT (or ./gpu_out). Usage:
#   bash scripts/gpu_check.sh [tests] [bench-attention] [e2e-llama] [e2e-prefix] [e2e-qwen3]   (default: all)
#   env: SWEEP=1 CASES="..." (bench-attention), BUDGETS="8192 2048" (e2e-qwen3), MODELS=/tmp/models
set -uo pipefail
OUT=${OUT:-gpu_out}; mkdir -p "$OUT"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1
STEPS=${*:-tests bench-attention e2e-llama e2e-prefix e2e-qwen3}
MODELS=${MODELS:-/tmp/models}
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__, torch.cuda.get_device_name())" | tee "$OUT/env.txt"
for step in $STEPS; do
  case $step in
    tests)
      python3 -m pytest -q -m gpu -o addopts="" tests 2>&1 | tee "$OUT/gpu_tests.log" | tail -30 ;;
    bench-attention)
      # SWEEP=1: also sweep tilings; CASES="prefill_4096 ...": only those cases
      python3 scripts/bench_attention.py "$OUT/attention_h200.json" ${SWEEP:+--sweep} ${CASES:+--cases $CASES} 2>&1 \
        | tee "$OUT/attention.log" | tail -20 ;;
    e2e-prefix)
      [ -d "$MODELS/llama3-8b" ] || python3 scripts/make_random_model.py llama3-8b "$MODELS/llama3-8b"
      for caching in true false; do
        python3 -m tritonllm.run model.path="$MODELS/llama3-8b" +experiment=prefix_sharing \
          cache.enable_prefix_caching=$caching output_json="$OUT/llama3-8b_prefix_$caching.json" \
          hydra.run.dir=/tmp/hydra 2>&1 | tail -3
      done ;;
    e2e-llama)
      [ -d "$MODELS/llama3-8b" ] || python3 scripts/make_random_model.py llama3-8b "$MODELS/llama3-8b"
      for exp in batch1_decode throughput_64x512; do
        python3 -m tritonllm.run model.path="$MODELS/llama3-8b" +experiment=$exp output_json="$OUT/llama3-8b_$exp.json" \
          hydra.run.dir=/tmp/hydra 2>&1 | tee "$OUT/llama3-8b_$exp.log" | tail -4
      done ;;
    e2e-qwen3)
      [ -d "$MODELS/qwen3-0.6b" ] || python3 scripts/make_random_model.py qwen3-0.6b "$MODELS/qwen3-0.6b"
      for budget in ${BUDGETS:-8192}; do
        python3 -m tritonllm.run model.path="$MODELS/qwen3-0.6b" +experiment=nanovllm_bench \
          scheduler.max_num_batched_tokens=$budget output_json="$OUT/qwen3-0.6b_nanovllm_b$budget.json" \
          hydra.run.dir=/tmp/hydra 2>&1 | tee "$OUT/qwen3-0.6b_nanovllm_b$budget.log" | tail -4
      done ;;
  esac
done

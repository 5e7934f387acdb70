#!/usr/bin/env bash
# On the lent GPU: the GPU test suite, then end-to-end benchmarks on random-weight models of real
# architectures. Results (JSON + logs) go to $OUT (or ./gpu_out). Usage:
#   bash scripts/gpu_check.sh [tests] [bench-attention] [e2e-llama] [e2e-prefix] [e2e-qwen3] [idle] [host-profile]
#   [profile-llama-b1] [profile-b1] [profile-prefill] [bench-sampling] [ablations-qwen3] [ablations-llama] [bench-gemm] [tune-gemm] [e2e-quant]
#   [bench-serving] [e2e-moe] [tune-moe] [bench-moe] [w4-scale-after] [pdl-steps] [w4-m64-plans] [mixed-step] [timeline] [norm-in-gemm] [moe-variants] [moe-reduce] [moe-loads] [moe-early] [ncu-moe] [moe-router] [gptoss-linears] [llama3-8b-config] [prefetch] [step-kernels] [half2] [half2-check] [half2-e2e] [w4-blocks] [next-first] [stream] [stream-e2e] [next-38] [stream-m1] [next-39] [next-42] [next-43] [next-44] [w4-mid] [tune-mid] [skinny-nopdl] [overlap] [dequant-tiles] [next-46] [tune-mid-fp8] [next-47] [next-48] [next-49] [next-50] [next-51] [w4-m64] [prefill-profile] [mixed-trace] [next-55] [next-52] [next-53] [moe-h100-tiles] [w4-async] [gemv-split] [w4-default] [next-57] [block-skinny] [next-58] [tests-kernels] [tests-engine] [prewait] [w4-tma-gemv] [w4-tma-e2e] [ncu-w4] [next-59] [moe-skinny] [next-60] [next-61] [next-62] [next-63] [moe-gluon-tilings] [next-64] [next-65] [next-66] [next-67] [rope-fold] [moe-layers] [norm-router] [s53-tests] [next-68]
#   (default: the first seven). env: SWEEP=1 CASES="..." (bench-attention), VARIANTS="overlap sync greedy ..." (e2e-qwen3),
#   TESTS="tests/..." (tests), MODELS=/tmp/models, ABLATIONS="chunked_prefill cuda_graphs ..." (ablations-*),
#   QUANT_VARIANTS="bf16_torch fp8_triton ..." QUANT_EXPS="batch1_decode ..." (e2e-quant)
# The GPU image lacks Hydra, FastAPI and gguf (a dependency: the quantization modules import it): fetch their
# wheels first with `../shared/gpu/fetch_wheels.sh gguf` (then drop .whl/numpy-*: the image has its own).
set -uo pipefail
OUT=${OUT:-gpu_out}; mkdir -p "$OUT"
if [ -z "${GPU_CHECK_NESTED:-}" ]; then  # the outermost call (steps call this script for their parts)
  if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site:$PWD
  else
    export PYTHONPATH=$PWD
  fi
  # a device reply brings back about eight files: past that, OUT is packed into one tarball as the script ends
  pack_out() {
    if [ "$(find "$OUT" -type f | wc -l)" -gt 8 ]; then
      (cd "$OUT" && tar czf ../gpu_out.tgz . && find . -mindepth 1 -delete && mv ../gpu_out.tgz .)
    fi
  }
  trap pack_out EXIT
  export GPU_CHECK_NESTED=1
fi
export PYTHONUNBUFFERED=1
STEPS=${*:-tests bench-attention e2e-llama e2e-prefix e2e-qwen3 idle host-profile}
MODELS=${MODELS:-/tmp/models}
# a random-weight model folder of that architecture (built once per machine)
ensure_model() { [ -d "$MODELS/$1" ] || python3 scripts/make_random_model.py "$1" "$MODELS/$1"; }
# whether this machine's GPU is an H200 (the GPU the issues' targets are stated on)
on_h200() { nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; }
# a config-only Llama-3-8B folder (config + tokenizer) for runs with --load-format dummy / model.load_format=dummy
ensure_config_model() { [ -d "$MODELS/llama3-8b-config" ] || python3 scripts/make_random_model.py llama3-8b "$MODELS/llama3-8b-config" --config-only; }
# nano-vllm's workload (its settings: temperature 0.6, text decoded), one timed pass after 2 warm-up requests
NANO="model.max_model_len=4096 workload.num_requests=256 workload.prompt_len_min=100 workload.prompt_len_max=1024
  workload.output_len_min=100 workload.output_len_max=1024 workload.token_id_max=10000 workload.temperature=0.6
  workload.detokenize=true"
# one ablation sweep (configs/experiment/ablate_$2.yaml) on model $1 with extra overrides; its runs
# (results.json + records.jsonl per point) go to $RUNS/$1_$2$TAG, and all sweeps so far to $OUT/ablations_$1.tar.gz
RUNS=${RUNS:-/tmp/ablations}  # EXTRA="key=value ...": overrides appended to every ablation (a small CPU dry run)
ablate() {
  local model=$1 name=$2; shift 2
  python3 -m tritonllm.run -m +experiment=ablate_$name model.path="$MODELS/$model" logger=jsonl "$@" ${EXTRA:-} \
    hydra.sweep.dir="$RUNS/${model}_$name${TAG:-}" 2>&1 | grep -E "output tok/s|Error|error" | tail -8
  tar czf "$OUT/ablations_$model.tar.gz" -C "$RUNS" $(cd "$RUNS" && ls -d "${model}"_*)
}
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__, torch.cuda.get_device_name())" | tee "$OUT/env.txt"
for step in $STEPS; do
  case $step in
    tests)
      # the server fuzz tests (no GPU marks) import schemathesis, which the GPU image lacks: not collected there
      python3 -c "import schemathesis" 2>/dev/null || no_fuzz="--ignore=tests/test_server_fuzz.py"
      python3 -m pytest -q -m gpu -o addopts="" ${no_fuzz:-} ${TESTS:-tests} 2>&1 | tee "$OUT/gpu_tests.log" | tail -30 ;;
    tests-kernels)
      # the kernel tests' GPU half on TEST_WORKERS pytest-xdist workers (the wheel in .whl; one file a worker at a
      # time, so a file's compiled kernels are reused), sharing the GPU: what `tests` runs serially, in one call. The
      # image lacks xdist: `python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 -d .whl
      # pytest-xdist execnet` first
      python3 -m pytest -q -m gpu -o addopts="" -n "${TEST_WORKERS:-6}" --dist loadfile ${TESTS:-tests/kernels tests/benchmarks} \
        2>&1 | tee "$OUT/gpu_tests_kernels.log" | tail -30 ;;
    tests-engine)
      # the engine-level GPU tests (whole models, graphs, PDL, overlap, structured outputs): serially they take
      # longer than one call (session 48: 36 of 51 in 570 s); TEST_WORKERS=4 runs them on xdist workers, each
      # engine's KV cache sized from its share of the card (tests/conftest.py; not yet tried on a GPU)
      python3 -m pytest -q -m gpu -o addopts="" ${TEST_WORKERS:+-n "$TEST_WORKERS" --dist loadfile} tests \
        --ignore=tests/kernels --ignore=tests/benchmarks --ignore=tests/test_server_fuzz.py 2>&1 \
        | tee "$OUT/gpu_tests_engine.log" | tail -30 ;;
    bench-attention)
      # SWEEP=1: also sweep tilings; CASES="prefill_4096 ...": only those cases
      python3 scripts/bench_attention.py "$OUT/attention_h200.json" ${SWEEP:+--sweep} ${CASES:+--cases $CASES} 2>&1 \
        | tee "$OUT/attention.log" | tail -20 ;;
    e2e-prefix)
      ensure_model llama3-8b
      for caching in true false; do
        python3 -m tritonllm.run model.path="$MODELS/llama3-8b" +experiment=prefix_sharing \
          cache.enable_prefix_caching=$caching output_json="$OUT/llama3-8b_prefix_$caching.json" \
          hydra.run.dir=/tmp/hydra 2>&1 | tail -3
      done ;;
    e2e-llama)
      ensure_model llama3-8b
      for exp in batch1_decode throughput_64x512; do
        python3 -m tritonllm.run model.path="$MODELS/llama3-8b" +experiment=$exp workload.detokenize=true \
          output_json="$OUT/llama3-8b_$exp.json" \
          hydra.run.dir=/tmp/hydra 2>&1 | tee "$OUT/llama3-8b_$exp.log" | tail -4
      done ;;
    e2e-qwen3)
      # nano-vllm's benchmark with its settings (overlap on, temperature 0.6, text decoded) and the
      # ablations: overlap off, greedy without text, greedy with text, top-p/top-k sampling, no piecewise graphs
      ensure_model qwen3-0.6b
      for variant in ${VARIANTS:-overlap sync greedy_nodetok sync_greedy_nodetok greedy topk_topp}; do
        case $variant in
          overlap) args="" ;;
          sync) args="scheduler.async_scheduling=false" ;;
          greedy_nodetok) args="workload.temperature=0 workload.detokenize=false" ;;
          sync_greedy_nodetok) args="scheduler.async_scheduling=false workload.temperature=0 workload.detokenize=false" ;;
          greedy) args="workload.temperature=0" ;;
          topk_topp) args="workload.top_p=0.95 workload.top_k=50" ;;
          topp) args="workload.top_p=0.95" ;;
          nopiecewise) args="piecewise_graphs=false" ;;
        esac
        python3 -m tritonllm.run model.path="$MODELS/qwen3-0.6b" +experiment=nanovllm_bench $args \
          output_json="$OUT/qwen3-0.6b_nanovllm_$variant.json" hydra.run.dir=/tmp/hydra 2>&1 \
          | tee "$OUT/qwen3-0.6b_nanovllm_$variant.log" | tail -1
      done ;;
    idle)
      # GPU idle share of a decode-heavy window (torch profiler), overlap on and off
      ensure_model qwen3-0.6b
      for mode in async-scheduling no-async-scheduling; do
        python3 scripts/profile_steps.py --model "$MODELS/qwen3-0.6b" --$mode --kernel-table 12 \
          --output-json "$OUT/idle_$mode.json" 2>&1 | grep -E "idle|step_ms"
      done ;;
    profile-llama-b1)
      # batch-1 decode of Llama-3-8B: kernel time per step (where TPOT goes), then the GPU idle share
      ensure_model llama3-8b
      python3 scripts/profile_steps.py --model "$MODELS/llama3-8b" --num-requests 1 --prompt-len 512 \
        --output-len 1024 --temperature 0 --steps 100 --kernel-table 20 --output-json "$OUT/profile_llama_b1.json" \
        2>&1 | tail -40 ;;
    profile-b1)
      # batch-1 decode profiles on config-only models (dummy weights), one per PROFILE_VARIANTS entry:
      # Llama-3-8B with bf16_torch / bf16_triton linears or fp8 / int4 / mxfp4 quantized online (Triton
      # GEMMs), 512-token prompt; gptoss: gpt-oss-20b (MXFP4 experts), 1024-token prompt (gptoss_triton: its
      # bf16 projections on the Triton GEMV too). PROFILE_ARGS: extra flags (--no-pdl), PROFILE_TAG: file suffix
      for variant in ${PROFILE_VARIANTS:-bf16_torch fp8 int4 mxfp4 gptoss}; do
        model=llama3-8b len=512
        case $variant in
          bf16_torch) args="--kernel linear=torch" ;;
          bf16_triton) args="--kernel linear=triton" ;;
          gptoss) args="" model=gpt-oss-20b len=1024 ;;
          gptoss_triton) args="--kernel linear=triton" model=gpt-oss-20b len=1024 ;;
          *) args="--quantization $variant --kernel linear=triton" ;;
        esac
        args="$args ${PROFILE_ARGS:-}"  # e.g. --no-pdl
        [ -d "$MODELS/$model-config" ] || python3 scripts/make_random_model.py $model "$MODELS/$model-config" --config-only
        python3 scripts/profile_steps.py --model "$MODELS/$model-config" --load-format dummy $args --num-requests 1 \
          --prompt-len $len --output-len 1024 --temperature 0 --steps 100 --kernel-table 30 \
          --output-json "$OUT/profile_b1_$variant${PROFILE_TAG:-}.json" 2>&1 | grep -v '^compile' | tail -75
      done ;;
    profile-prefill)
      # prefill and mixed steps of nano-vllm's workload, forward from piecewise graphs and eager
      ensure_model qwen3-0.6b
      for mode in piecewise-graphs no-piecewise-graphs; do
        python3 scripts/profile_steps.py --model "$MODELS/qwen3-0.6b" --phase prefill --steps 40 --kernel-table 20 \
          --$mode --output-json "$OUT/profile_prefill_$mode.json" 2>&1 | tail -40
      done ;;
    bench-sampling)
      python3 scripts/bench_sampling.py "$OUT/sampling_h200.json" 2>&1 | tee "$OUT/sampling.log" | tail -20 ;;
    ablations-qwen3)
      # every ablation on Qwen3-0.6B, nano-vllm's workload unless the ablation needs its own
      ensure_model qwen3-0.6b
      for name in ${ABLATIONS:-chunked_prefill cuda_graphs overlap kv_cache_dtype attention prefix_caching policy block_size}; do
        case $name in
          chunked_prefill) ablate qwen3-0.6b $name $NANO scheduler.enable_chunked_prefill=true
                           TAG=_off ablate qwen3-0.6b $name $NANO scheduler.enable_chunked_prefill=false \
                             scheduler.max_num_batched_tokens=8192 ;;
          attention)  # 64 x 512 + 128 for the Triton kernels (bf16 and FP8 caches); the torch reference
                      # (eager, per-sequence loops) beside the unified kernel on 8 requests
                      ablate qwen3-0.6b $name cache.kv_cache_dtype=auto,fp8 kernels.attention=auto,triton_unified
                      TAG=_reference ablate qwen3-0.6b $name kernels.attention=triton_unified,torch_ref \
                        workload.num_requests=8 workload.warmup_requests=1 ;;
          prefix_caching) ablate qwen3-0.6b $name ;;  # 200 requests sharing a 2,000-token prompt
          *) ablate qwen3-0.6b $name $NANO ;;
        esac
      done ;;
    ablations-llama)
      # Llama-3-8B: graphs at batch 1, the rest on 64 x 512 + 128
      ensure_model llama3-8b
      for name in ${ABLATIONS:-cuda_graphs kv_cache_dtype chunked_prefill attention block_size}; do
        case $name in
          cuda_graphs) ablate llama3-8b $name workload.num_requests=1 workload.warmup_requests=1 enforce_eager=true,false piecewise_graphs=true ;;
          attention) ablate llama3-8b $name cache.kv_cache_dtype=auto,fp8 ;;
          *) ablate llama3-8b $name ;;
        esac
      done ;;
    bench-gemm)
      # every linear implementation beside torch's GEMMs (MODELS_GEMM="llama3-8b ...", FORMATS="bf16 fp8 ...")
      python3 scripts/bench_gemm.py "$OUT/gemm_h200.json" ${MODELS_GEMM:+--models $MODELS_GEMM} \
        ${FORMATS:+--formats $FORMATS} 2>&1 | tee "$OUT/gemm.log" | tail -40 ;;
    tune-gemm)
      # tile sweep for the GEMM tables (TUNE_SUITES="large block skinny")
      python3 scripts/tune_gemm.py "$OUT/tune_gemm_h200.json" ${TUNE_SUITES:+--suites $TUNE_SUITES} 2>&1 \
        | tee "$OUT/tune_gemm.log" | grep -v "^compile" | tail -60 ;;
    e2e-quant)
      # Llama-3-8B batch 1 and 64 x 512 + 128 (config-only folder, dummy weights quantized online): cuBLAS bf16,
      # all-Triton bf16, online FP8 through cuBLAS and Triton, int8 / int4 / MXFP4 through Triton.
      # QUANT_ARGS: extra overrides for every run (e.g. pdl=false, fuse_rope_kv_write=false), QUANT_TAG: file-name suffix
      ensure_config_model
      for variant in ${QUANT_VARIANTS:-bf16_torch bf16_triton fp8_torch fp8_triton}; do
        case $variant in
          bf16_torch) args="kernels.linear=torch" ;;
          bf16_triton) args="kernels.linear=triton" ;;
          fp8_torch) args="model.quantization=fp8 kernels.linear=torch" ;;
          fp8_triton) args="model.quantization=fp8 kernels.linear=triton" ;;
          fp8_gluon) args="model.quantization=fp8 kernels.linear=triton_sm90" ;;
          fp8_gluon_tok) args="model.quantization=fp8 kernels.linear=triton_sm90 decode_group_quant=false" ;;
          fp8_gluon_xq) args="model.quantization=fp8 kernels.linear=triton_sm90 fuse_down_input_quant=true" ;;
          fp8_gluon_xn) args="model.quantization=fp8 kernels.linear=triton_sm90 fuse_norm_into_gemm=true" ;;
          fp8_gluon_xnmlp) args="model.quantization=fp8 kernels.linear=triton_sm90 fuse_norm_into_gemm=true
            fuse_gated_activation=true fuse_down_input_quant=true" ;;
          bf16_gluon) args="kernels.linear=triton_sm90" ;;
          int8_triton) args="model.quantization=int8 kernels.linear=triton" ;;
          int4_triton) args="model.quantization=int4 kernels.linear=triton" ;;
          mxfp4_triton) args="model.quantization=mxfp4 kernels.linear=triton" ;;
          int4_gluon) args="model.quantization=int4 kernels.linear=triton_sm90" ;;
          mxfp4_gluon) args="model.quantization=mxfp4 kernels.linear=triton_sm90" ;;
        esac
        for exp in ${QUANT_EXPS:-batch1_decode throughput_64x512}; do
          python3 -m tritonllm.run model.path="$MODELS/llama3-8b-config" model.load_format=dummy +experiment=$exp \
            workload.detokenize=true $args ${QUANT_ARGS:-} output_json="$OUT/llama3-8b_${exp}_$variant${QUANT_TAG:-}.json" \
            hydra.run.dir=/tmp/hydra 2>&1 | grep -E "output tok/s|Error"
        done
      done ;;
    bench-serving)
      # issue 15's serving figures: the OpenAI server on Llama-3-8B (random weights), scripts/bench_serving.py at
      # Poisson rates RATES="4 8 16 ..." (512 in / 128 out streamed, temperature 0.8); SERVE_MODEL overrides the model
      [ -n "${SERVE_MODEL:-}" ] || ensure_model llama3-8b
      SERVE_PATH=${SERVE_MODEL:-$MODELS/llama3-8b}
      # RATES="" (empty): no server, only the offline references
      RATES=${RATES-4 8 16 24 32 48 64}
      if [ -n "$RATES" ]; then
        python3 -m tritonllm.entrypoints.cli serve "$SERVE_PATH" --host 127.0.0.1 --port 8123 --served-model-name m \
          --uvicorn-log-level warning ${SERVE_ARGS:-} > "$OUT/serve.log" 2>&1 &
        SERVER=$!
        for _ in $(seq 600); do
          curl -sf http://127.0.0.1:8123/health > /dev/null && break
          kill -0 $SERVER 2> /dev/null || { echo "the server exited at start-up:"; tail -5 "$OUT/serve.log"; break; }
          sleep 1
        done
        # each run its own prompts (--seed): a repeated seed would be served from the prefix cache (earlier
        # sessions' "again" runs at 16 req/s were, hence their lower TTFT and TPOT); a repeated rate is saved apart
        # SERVE_PROFILE=S: py-spy (from .whl) samples the server's threads for S seconds of the first rate's run
        # (GIL holders only, --gil: which thread keeps the engine thread waiting), into $OUT/serve_pyspy.txt
        [ -n "${SERVE_PROFILE:-}" ] && (sleep 5; /tmp/site/bin/py-spy record --pid $SERVER --duration "$SERVE_PROFILE" \
          --rate 250 --threads --gil --nonblocking --format raw -o "$OUT/serve_pyspy.txt" > "$OUT/pyspy.log" 2>&1) &
        seed=0
        for rate in $RATES; do
          name="serving_rate_$rate"; [ -e "$OUT/$name.json" ] && name="${name}_seed$seed"
          python3 scripts/bench_serving.py --base-url http://127.0.0.1:8123 --model m --num-prompts ${NUM_PROMPTS:-400} \
            --random-input-len ${INPUT_LEN:-512} --random-output-len ${OUTPUT_LEN:-128} --request-rate "$rate" \
            --token-id-max ${TOKEN_ID_MAX:-10000} --seed $seed \
            --save-result "$OUT/$name.json" 2>&1 | tail -13
          seed=$((seed + 1))
        done
        kill -TERM $SERVER; wait $SERVER; echo "server exit status $?"
      fi
      # the offline references: the same requests all at once, OFFLINE_COUNTS at a time (req/s; decode TPOT at
      # that concurrency), one LLM, after the server has given the GPU back
      [ "${OFFLINE_COUNTS-unset}" = "" ] || python3 - "$SERVE_PATH" "$OUT/offline_reference.json" ${OFFLINE_COUNTS:-64 16 24 32} <<'PY' 2>&1 | grep -v Warning
import json, os, sys
from tritonllm.entrypoints.llm import LLM
from tritonllm.workloads import run_random
# OFFLINE_LOAD_FORMAT=dummy: random weights, as the server's SERVE_ARGS="--load-format dummy" gives them
llm, rows = LLM(model=sys.argv[1] or None, load_format=os.environ.get("OFFLINE_LOAD_FORMAT", "auto")), []
for count in map(int, sys.argv[3:]):
    work = dict(kind="random", num_requests=count, prompt_len_min=512, prompt_len_max=512, output_len_min=128,
                output_len_max=128, token_id_max=10000, temperature=0.8, detokenize=True, seed=0,
                warmup_prompt="Benchmark: ", warmup_requests=0, passes=2)
    r = run_random(llm, work); r.pop("requests", None); warm = r["passes"][-1]  # the second pass: warm
    rows.append({"num_requests": count, "req_per_s": count / warm["elapsed_s"], "warm": warm, "first": r})
    print(count, "requests (warm):", round(count / warm["elapsed_s"], 2), "req/s, TPOT p50", warm.get("tpot_p50_ms"),
          "ms, first pass", round(count / r["elapsed_s"], 2), "req/s", flush=True)
json.dump(rows, open(sys.argv[2], "w"), indent=2)
PY
      ;;
    e2e-moe)
      # issue 16's end-to-end MoE figures on random weights made on the GPU (model.load_format=dummy: the
      # folders hold config.json and a tokenizer only; Qwen3-30B-A3B's 61 GB would not fit the disk):
      # Qwen3-30B-A3B 1000 x 1024 + 128; gpt-oss-20b (MXFP4 experts) batch 1 and 256 x 1024 + 1024.
      # MOE_RUNS="qwen3_throughput gptoss_batch1 gptoss_throughput" picks; MOE_ARGS: extra overrides; MOE_TAG: file suffix
      for run in ${MOE_RUNS:-qwen3_throughput gptoss_batch1 gptoss_throughput}; do
        case $run in
          qwen3_throughput) model=qwen3-30b-a3b exp=throughput_1000x1024 ;;
          gptoss_batch1) model=gpt-oss-20b exp=batch1_1024 ;;
          gptoss_throughput) model=gpt-oss-20b exp=throughput_256x1024 ;;
        esac
        [ -d "$MODELS/$model-config" ] || python3 scripts/make_random_model.py $model "$MODELS/$model-config" --config-only
        python3 -m tritonllm.run model.path="$MODELS/$model-config" model.load_format=dummy +experiment=$exp \
          output_json="$OUT/${model}_$exp${MOE_TAG:-}.json" hydra.run.dir=/tmp/hydra ${MOE_ARGS:-} 2>&1 \
          | tee "$OUT/${model}_$exp${MOE_TAG:-}.log" | grep -E "tok/s|Error|error" | tail -4
      done ;;
    tune-moe)
      # the fused-MoE tile sweep, one (shape, kind) per TUNE_MOE entry "shape:kind" (a few minutes each;
      # TUNE_MOE_TOKENS="1 4", TUNE_MOE_BLOCK_MS=1: the GEMV alone); the merged table, named for the GPU
      # it ran on (moe_tiles.tuned_file: an H100's is not an H200's), goes to $OUT: copy it to kernels/tuned/
      table=$(python3 -c "import torch; from tritonllm.kernels.moe_tiles import tuned_file
print(tuned_file(torch.cuda.get_device_name()))")
      cp "$table" "$OUT/" 2>/dev/null  # this sweep's buckets replace the device's table's, the rest stay
      for case in ${TUNE_MOE:-qwen3:bfloat16}; do
        python3 scripts/tune_moe.py "$OUT/tune_moe_${case/:/_}.json" --shapes ${case%%:*} --kinds ${case##*:} \
          ${TUNE_MOE_TOKENS:+--tokens $TUNE_MOE_TOKENS} ${TUNE_MOE_BLOCK_MS:+--block-ms $TUNE_MOE_BLOCK_MS} 2>&1 \
          | tee "$OUT/tune_moe_${case/:/_}.log" | grep -v "^compile" | tail -12
        python3 scripts/tune_moe.py "$OUT/tune_moe_${case/:/_}.json" --write-tuned "$OUT/$(basename "$table")" --update
      done ;;
    bench-moe)
      # the fused MoE beside torch at Qwen3-30B-A3B's layer (BENCH_MOE_KINDS="bfloat16 fp8_block mxfp4")
      # (BENCH_MOE_TOKENS="4096 8192": those only; BENCH_MOE_TAG: file suffix)
      python3 scripts/bench_moe.py "$OUT/moe_bench${BENCH_MOE_TAG:-}.json" --shapes ${BENCH_MOE_SHAPES:-qwen3} \
        --kinds ${BENCH_MOE_KINDS:-bfloat16 fp8_block mxfp4} ${BENCH_MOE_TOKENS:+--tokens $BENCH_MOE_TOKENS} 2>&1 \
        | tee "$OUT/moe_bench${BENCH_MOE_TAG:-}.log" | tail -30 ;;
    w4-scale-after)
      # the W4 GEMM's opt-in scale-after mode (session 20, not yet run on a GPU): its GPU tests, the layer
      # sweep (weights cold in L2) against the default plans, then Llama-3-8B int4 decode steps with and without it
      python3 -m pytest -q -m gpu -o addopts="" tests/kernels/test_gemm_w4_sm90.py -k "scale_after or every_plan" 2>&1 | tail -3
      python3 experiments/quant4/gemm_sm90/sweep.py "$OUT/w4_scale_after.json" --ms 2 16 32 64 --plans auto auto_sa \
        2>&1 | grep -v "^compile" | tail -20
      ensure_config_model
      for seqs in ${W4_SEQS:-4 16 64}; do  # the decode step at 4 / 16 / 64 sequences (M = 4 / 16 / 64 GEMMs)
        for sa in 0 1; do
          TRITONLLM_W4_SCALE_AFTER=$sa python3 scripts/profile_steps.py --model "$MODELS/llama3-8b-config" \
            --load-format dummy --quantization int4 --kernel linear=triton_sm90 --num-requests $seqs --prompt-len 512 \
            --output-len 160 --temperature 0 --steps 40 --output-json "$OUT/w4_step_${seqs}seqs_scale_after$sa.json" \
            2>&1 | grep -E '"step_ms"'
        done
      done ;;
    w4-m64-plans)
      # the W4 GEMM's opt-in plan fields of session 21 (not yet run on a GPU): words two steps ahead, the activation
      # loaded at its own step (181 -> 128 registers at M = 64: four programs an SM, not two); GPU plan tests, then
      # the layer sweep at M = 32 / 48 / 64 (weights cold in L2) against the default plans
      python3 -m pytest -q -m gpu -o addopts="" tests/kernels/test_gemm_w4_sm90.py -k "every_plan" 2>&1 | tail -3
      python3 experiments/quant4/gemm_sm90/sweep.py "$OUT/w4_m64_plans.json" --ms ${W4_MS:-32 48 64} --plans auto \
        ${W4_PLANS:-64:2:1:4:0:0 64:4:1:4:0:0 64:4:2:4:0:0 64:2:2 64:4:2 128:2:1:8:0:0} 2>&1 | grep -v "^compile" | tail -20 ;;
    llama3-8b-config)
      ensure_config_model ;;
    mixed-step)
      # issue 15: what a prompt joining MIXED_DECODES running decodes adds to its step, per piecewise_first_size
      # (the padded token counts of the piecewise graphs; "eager": piecewise graphs off); Llama-3-8B, dummy weights
      ensure_config_model
      for first in ${MIXED_FIRST_SIZES:-256 128 64 eager}; do
        case $first in eager) args="--no-piecewise-graphs" ;; *) args="--piecewise-first-size $first" ;; esac
        python3 experiments/serving/mixed_step.py --model "$MODELS/llama3-8b-config" --load-format dummy $args \
          --decodes ${MIXED_DECODES:-13} --prompt-lens ${MIXED_LENS:-128 256 400 499 512 640 1000 2000} \
          --output-json "$OUT/mixed_step_$first.json" 2>&1 | grep -E "^\{|Error" | tee "$OUT/mixed_step_$first.log"
      done ;;
    pdl-steps)
      # decode step time with PDL on and off (Llama-3-8B, dummy weights, 512 + 160, greedy) at PDL_SEQS sequences
      # for PDL_VARIANTS (fp8 / int4 / mxfp4 quantized online, bf16: the Triton sm90 linears; bf16_torch: cuBLAS):
      # session 20 found PDL costing the W4 GEMM 15% a step at 64 sequences; which other kernels does it cost?
      ensure_config_model
      for variant in ${PDL_VARIANTS:-fp8 bf16}; do
        case $variant in
          bf16) args="--kernel linear=triton_sm90" ;;
          bf16_torch) args="--kernel linear=torch" ;;
          *) args="--quantization $variant --kernel linear=triton_sm90" ;;
        esac
        for seqs in ${PDL_SEQS:-4 16 64}; do
          for pdl in pdl no-pdl; do
            printf '%s %s seqs %s: ' "$variant" "$pdl" "$seqs"
            python3 scripts/profile_steps.py --model "$MODELS/llama3-8b-config" --load-format dummy $args --$pdl \
              --num-requests $seqs --prompt-len 512 --output-len 160 --temperature 0 --steps 40 --kernel-table 12 \
              --output-json "$OUT/steps_${variant}_${seqs}seqs_$pdl.json" 2>&1 | grep -E '"step_ms"'
          done
        done
      done ;;
    norm-in-gemm)
      # session 25's build, for its first GPU run: the XN / ADD_C GPU tests, then batch-1 FP8 with and without
      # fuse_norm_into_gemm beside bf16 cuBLAS (e2e), then both FP8 timelines
      python3 -m pytest -q -m gpu -o addopts="" tests/kernels/test_gemm_skinny_sm90.py tests/test_pdl.py \
        tests/test_engine_gpu.py -k "xn or add_c or norm or xq or down_input or gated or compiles or pdl" 2>&1 \
        | tee "$OUT/gpu_tests_norm_in_gemm.log" | tail -15
      QUANT_VARIANTS="bf16_torch fp8_gluon fp8_gluon_xn fp8_gluon_xnmlp" QUANT_EXPS=batch1_decode bash "$0" e2e-quant
      TIMELINE_VARIANTS="fp8 fp8_xn fp8_xnmlp" bash "$0" timeline ;;
    moe-variants)
      # session 26's build, for its first GPU run: the MoE GEMV's deferred K reduction and its variants (joint
      # gate/up pass, w2 summing the slots in registers), the grouped GEMM's B through tensor descriptors (TMA).
      # GPU tests; the layer under each variant at decode sizes (Qwen3-30B-A3B bf16 / FP8 block, gpt-oss MXFP4)
      # and at prefill sizes (Qwen3 bf16 / FP8 block: the 450 TFLOP/s target at 8192); the tile sweep of gpt-oss
      # MXFP4 at 1 token with the variants (its table installed in this copy); gpt-oss-20b batch 1 end to end
      # (and MOE_VARIANT_RUNS="gptoss_batch1 qwen3_throughput": Qwen3-30B-A3B 1000 x 1024 + 128 too) with the
      # variants off and on (MOE_VARIANTS="none joint,sum_slots,tma": tma = every descriptor read, sorted_w2 included)
      python3 -m pytest -q -m gpu -o addopts="" tests/kernels/test_moe.py 2>&1 | tee "$OUT/gpu_tests_moe.log" | tail -5
      python3 scripts/bench_moe.py "$OUT/moe_variants_decode.json" --shapes qwen3 gptoss --kinds bfloat16 fp8_block mxfp4 \
        --tokens 1 4 --torch-ref-max-tokens 0 --variants 2>&1 | tee "$OUT/moe_variants_decode.log" | tail -40
      python3 scripts/bench_moe.py "$OUT/moe_variants_prefill.json" --shapes qwen3 --kinds bfloat16 fp8_block \
        --tokens 1024 4096 8192 --torch-ref-max-tokens 0 --variants 2>&1 | tee "$OUT/moe_variants_prefill.log" | tail -30
      TUNE_MOE="gptoss:mxfp4" TUNE_MOE_TOKENS="1" bash "$0" tune-moe
      cp "$OUT"/moe_NVIDIA_*.json tritonllm/kernels/tuned/
      for variant in ${MOE_VARIANTS:-none joint,sum_slots,tma}; do
        TRITONLLM_MOE_VARIANTS=$variant MOE_RUNS="${MOE_VARIANT_RUNS:-gptoss_batch1}" MOE_TAG="_variants_${variant//,/_}" \
          bash "$0" e2e-moe
      done ;;
    moe-reduce)
      # session 27's build: the float MoE GEMV's three K reductions (TRITONLLM_MOE_GEMV_REDUCE 0: a cross-thread
      # sum a step, 1: per column then once, 2: per thread's 8 columns a step, the default) at decode sizes,
      # each with the GEMV variants, bf16 and FP8 block, Qwen3-30B-A3B's and gpt-oss's layers
      for r in 2 1 0; do
        TRITONLLM_MOE_GEMV_REDUCE=$r python3 scripts/bench_moe.py "$OUT/moe_reduce$r.json" --shapes gptoss qwen3 \
          --kinds bfloat16 fp8_block --tokens 1 4 --torch-ref-max-tokens 0 --variants > "$OUT/moe_reduce$r.log" 2>&1
        echo "== REDUCE $r"; grep -E "T=|none|both" "$OUT/moe_reduce$r.log" | cut -c1-100
      done
      # each kernel's time in the decode layer's graph replay (the defaults), where the microseconds go
      python3 scripts/bench_moe.py "$OUT/moe_kernels.json" --shapes gptoss qwen3 --kinds bfloat16 fp8_block mxfp4 \
        --tokens 1 4 --torch-ref-max-tokens 0 --kernels 2>&1 | tee "$OUT/moe_kernels.log" | grep -E "T=|kernels" ;;
    moe-router)
      # session 29's build, for its first GPU run: a MoE block's router GEMM (cuBLAS, often with a split-K reduction
      # kernel) and its routing kernel as one kernel at decode sizes (fuse_moe_router, kernels/moe_route.py's
      # router_route): its GPU tests, the router alone (bench_moe: GEMM + route against fused, graph replay), gpt-oss-20b
      # batch 1 end to end without and with it (MOE_ROUTER_RUNS adds e.g. qwen3_throughput); MOE_ROUTER_PROFILE=1:
      # then both batch-1 kernel tables (where the router's microseconds went)
      python3 -m pytest -q -m gpu -o addopts="" tests/kernels/test_moe_router.py tests/test_engine_gpu.py -k "router" \
        2>&1 | tail -3
      python3 scripts/bench_moe.py "$OUT/moe_router.json" --shapes gptoss qwen3 --kinds mxfp4 --tokens 1 4 8 \
        --torch-ref-max-tokens 0 2>&1 | grep -E "T=|router"
      for fuse in false true; do
        MOE_RUNS="${MOE_ROUTER_RUNS:-gptoss_batch1}" MOE_ARGS="fuse_moe_router=$fuse" MOE_TAG="_router_$fuse" bash "$0" e2e-moe
      done
      if [ -n "${MOE_ROUTER_PROFILE:-}" ]; then
        PROFILE_VARIANTS=gptoss PROFILE_ARGS=--no-fuse-moe-router PROFILE_TAG=_router_false bash "$0" profile-b1 \
          | grep -E "step_ms|route|nvjet|splitK"
        PROFILE_VARIANTS=gptoss PROFILE_ARGS=--fuse-moe-router PROFILE_TAG=_router_true bash "$0" profile-b1 \
          | grep -E "step_ms|route|nvjet|splitK"
      fi ;;
    gptoss-linears)
      # gpt-oss-20b batch 1 with its bf16 projections (qkv, o with biases, the 201k-row LM head) on the Triton skinny
      # GEMM (kernels.linear=triton_sm90: M <= 4 bf16, split-K summed in the kernel) instead of cuBLAS (auto: torch;
      # cuBLAS splits o_proj's K and launches a reduction kernel after it), each end to end
      for linear in torch triton_sm90; do
        MOE_RUNS=gptoss_batch1 MOE_ARGS="kernels.linear=$linear" MOE_TAG="_linear_$linear" bash "$0" e2e-moe
      done ;;
    moe-loads)
      # session 28's build: the MoE GEMV's load schedules (TRITONLLM_MOE_GEMV_LOADS 0: the scales loaded late,
      # MXFP4's behind the activation's layout-change barriers, FP8 block's after the products, the default;
      # 1: every load at the top of its step; 2: a step ahead in registers): their tests on the GPU, then each
      # kernel's time in the decode layer (L2 flushed) per schedule, gpt-oss and Qwen3-30B-A3B shapes, bf16,
      # FP8 block and MXFP4 experts, 1 and 4 tokens; MOE_LOADS_E2E=N: then gpt-oss-20b batch 1 under schedule N
      python3 -m pytest -q -o addopts="" tests/kernels/test_moe.py -k "load_schedules or mxfp4" 2>&1 | tail -3
      for l in 0 1 2; do
        TRITONLLM_MOE_GEMV_LOADS=$l python3 scripts/bench_moe.py "$OUT/moe_loads$l.json" --shapes gptoss qwen3 \
          --kinds ${MOE_LOADS_KINDS:-mxfp4 fp8_block bfloat16} --tokens 1 4 --torch-ref-max-tokens 0 --kernels \
          > "$OUT/moe_loads$l.log" 2>&1
        echo "== LOADS $l"; grep -E "T=|kernels" "$OUT/moe_loads$l.log" | cut -c1-160
      done
      # the opt-in Gluon MoE GEMV for MXFP4 experts (kernels/moe_gemv_sm90.py): its GPU tests, then the decode
      # layer's kernels with it (beside the LOADS runs above)
      python3 -m pytest -q -m gpu -o addopts="" tests/kernels/test_moe_gemv_sm90.py 2>&1 | tail -3
      TRITONLLM_MOE_GEMV_GLUON=1 python3 scripts/bench_moe.py "$OUT/moe_gluon.json" --shapes gptoss qwen3 --kinds mxfp4 \
        --tokens 1 4 --torch-ref-max-tokens 0 --kernels > "$OUT/moe_gluon.log" 2>&1
      echo "== Gluon MoE GEMV"; grep -E "T=|kernels" "$OUT/moe_gluon.log" | cut -c1-160
      # the grouped GEMM's FP8 block B scale, one load a K step where the tile lies in one scale block (the
      # default since session 28) against one a column (before), Qwen3-30B-A3B's layer at prefill sizes
      for v in tile column; do
        TRITONLLM_MOE_FP8_B_SCALE=$v python3 scripts/bench_moe.py "$OUT/moe_fp8_bscale_$v.json" --shapes qwen3 \
          --kinds fp8_block --tokens 1024 4096 8192 --torch-ref-max-tokens 0 > "$OUT/moe_fp8_bscale_$v.log" 2>&1
        echo "== FP8 B scale a $v"; grep -E "T=" "$OUT/moe_fp8_bscale_$v.log" | cut -c1-120
      done
      if [ -n "${MOE_LOADS_E2E:-}" ]; then
        TRITONLLM_MOE_GEMV_LOADS=$MOE_LOADS_E2E MOE_RUNS=gptoss_batch1 MOE_TAG="_loads$MOE_LOADS_E2E" bash "$0" e2e-moe
      fi ;;
    prefetch)
      # the L2 weight prefetch (layers/prefetch.py, prefetch_weights), off / on on one machine, in parts
      # (PREFETCH_PARTS; all of them take ~17 minutes: split them over calls of 600 s):
      #   tests   its GPU tests
      #   batch1  Llama-3-8B batch 1 per PREFETCH_VARIANTS (e2e-quant's names), off/on/on/off
      #   short   int4 with the untimed short links (TRITONLLM_PREFETCH_SHORT_MB per PREFETCH_SHORT_MB: the tail
      #           of the next weight across a norm or an activation), against batch1's int4 runs
      #   seqs    int4 at each PREFETCH_SEQS request count, TRITONLLM_PREFETCH_MAX_SEQS raised to it, off/on
      #   gptoss  gpt-oss-20b batch 1 off, on, and on with the routed experts' w2 (TRITONLLM_PREFETCH_EXPERTS=1)
      #   layer   experiments/l2_prefetch/bench_prefetch.py's MoE tail (kernels' us under each prefetch mode)
      parts=" ${PREFETCH_PARTS:-tests layer batch1 short seqs gptoss} "
      if [[ $parts == *" tests "* ]]; then
        python3 -m pytest -q -m gpu -o addopts="" tests/kernels/test_l2_prefetch.py \
          "tests/test_engine_gpu.py::test_batch1_decode_with_weight_prefetch_matches_without" 2>&1 | tail -2
      fi
      if [[ $parts == *" layer "* ]]; then
        python3 experiments/l2_prefetch/bench_prefetch.py "$OUT/l2_prefetch_moe.json" --gemv 2>&1 | grep '^{' | cut -c1-600
      fi
      if [[ $parts == *" batch1 "* ]]; then
        for variant in ${PREFETCH_VARIANTS:-fp8_gluon int4_gluon mxfp4_gluon}; do
          i=0
          for pf in false true true false; do
            i=$((i + 1))
            QUANT_VARIANTS=$variant QUANT_EXPS=batch1_decode QUANT_ARGS="prefetch_weights=$pf" QUANT_TAG="_pf_${pf}_$i" \
              bash "$0" e2e-quant | grep "tok/s" | sed "s/^/$variant prefetch=$pf: /"
          done
        done
      fi
      if [[ $parts == *" short "* ]]; then
        for mb in ${PREFETCH_SHORT_MB:-4 8}; do
          TRITONLLM_PREFETCH_SHORT_MB=$mb QUANT_VARIANTS=int4_gluon QUANT_EXPS=batch1_decode QUANT_TAG="_pf_short$mb" \
            bash "$0" e2e-quant | grep "tok/s" | sed "s/^/int4 prefetch + short links ($mb MB): /"
        done
      fi
      if [[ $parts == *" seqs "* ]]; then
        for n in ${PREFETCH_SEQS:-2 4 8}; do
          for pf in false true; do
            TRITONLLM_PREFETCH_MAX_SEQS=$n QUANT_VARIANTS=int4_gluon QUANT_EXPS=batch1_decode \
              QUANT_ARGS="prefetch_weights=$pf workload.num_requests=$n" QUANT_TAG="_${n}req_pf_$pf" bash "$0" e2e-quant \
              | grep "tok/s" | sed "s/^/int4 $n requests prefetch=$pf: /"
          done
        done
      fi
      if [[ $parts == *" gptoss "* ]]; then
        for pf in false true; do
          MOE_RUNS=gptoss_batch1 MOE_ARGS="prefetch_weights=$pf" MOE_TAG="_pf_$pf" bash "$0" e2e-moe \
            | sed "s/^/gpt-oss prefetch=$pf: /"
        done
        TRITONLLM_PREFETCH_EXPERTS=1 MOE_RUNS=gptoss_batch1 MOE_TAG="_pf_experts" bash "$0" e2e-moe \
          | sed "s/^/gpt-oss prefetch + routed experts: /"
      fi ;;
    step-kernels)
      # session 33's builds for the small work of a decode step: the step's inputs and sampling parameters in
      # two launches (kernels/step_inputs.py, on by default; TRITONLLM_STEP_INPUT_KERNELS=0: torch's ~17) and
      # each row's vocabulary sampled over several programs at batches of up to TRITONLLM_SAMPLE_SPLIT_ROWS rows
      # (kernels/sampling.py _sample_split_kernel, off until this runs). Their GPU tests (the split: eager and
      # graph-replayed against one program a row), then batch 1 in the order torch / inputs / inputs + split /
      # torch: gpt-oss-20b (greedy) and Llama-3-8B bf16 at temperature 0.8 (text decoded); then gpt-oss's step
      # timeline with both
      python3 -m pytest -q -m gpu -o addopts="" tests/kernels/test_sampling.py tests/test_decode_graphs.py \
        tests/test_engine_gpu.py 2>&1 | tail -3
      for v in "0 0" "1 0" "1 8" "0 0"; do
        set -- $v
        TRITONLLM_STEP_INPUT_KERNELS=$1 TRITONLLM_SAMPLE_SPLIT_ROWS=$2 MOE_RUNS=gptoss_batch1 MOE_TAG="_inputs$1_split$2" \
          bash "$0" e2e-moe | sed "s/^/gpt-oss step inputs $1 split rows $2: /"
        TRITONLLM_STEP_INPUT_KERNELS=$1 TRITONLLM_SAMPLE_SPLIT_ROWS=$2 QUANT_VARIANTS=bf16_gluon QUANT_EXPS=batch1_decode \
          QUANT_ARGS="workload.temperature=0.8" QUANT_TAG="_t08_inputs$1_split$2" bash "$0" e2e-quant | grep "tok/s" \
          | sed "s/^/llama bf16 t=0.8 step inputs $1 split rows $2: /"
      done
      [ -d "$MODELS/gpt-oss-20b-config" ] || python3 scripts/make_random_model.py gpt-oss-20b "$MODELS/gpt-oss-20b-config" --config-only
      TRITONLLM_SAMPLE_SPLIT_ROWS=8 python3 scripts/profile_steps.py --model "$MODELS/gpt-oss-20b-config" --load-format dummy \
        --pdl --num-requests 1 --prompt-len 1024 --output-len 160 --temperature 0 --steps 20 --trace /tmp/trace_steps.json \
        --output-json "$OUT/steps_gptoss_step_kernels.json" 2>&1 | grep -E '"step_ms"'
      python3 scripts/step_timeline.py /tmp/trace_steps.json --steps 20 --json "$OUT/timeline_gptoss_step_kernels.json" \
        | tee "$OUT/timeline_gptoss_step_kernels.txt" | head -24 ;;
    half2|half2-check)
      # session 34's build: 4-bit nibble pairs decoded into fp16x2 and multiplied by packed half-precision FMAs
      # (kernels/gemv_w4.py FP4_HALF2; NVIDIA's default since session 36, TRITONLLM_W4_HALF2=0: off), with session 35's (a word's four MXFP4 pairs at once,
      # int4 chained over a thread's run of four words, w2's factor from the activation's bound). sm90 SASS a K
      # step (Triton 3.6): gpt-oss's MoE w13 695 -> 490, w2 715 -> 497 (the decode layer on an H100: 42.56 -> 37.76 us);
      # the Gluon GEMV MXFP4 1,166 -> 713, int4 548 -> 373 at its default tiling, 560 at 8:4:0. half2-check (about
      # 8 minutes): the GPU tests of the changed kernels; the decode layer's MoE kernels off / on; the Gluon GEMV's
      # tilings on Llama-3-8B's layers at M = 1 on / off. half2-e2e: gpt-oss-20b batch 1 on / off / on / off, then
      # Llama-3-8B int4 and MXFP4 batch 1 off / on (over 600 s: HALF2_E2E="1 0" for the first pair alone).
      timeout 240 python3 -m pytest -q -m gpu -o addopts="" tests/kernels/test_w4_half2.py tests/kernels/test_gemv_w4_sm90.py \
        tests/kernels/test_moe.py 2>&1 | tail -6
      for h in 0 1; do
        TRITONLLM_W4_HALF2=$h timeout 100 python3 scripts/bench_moe.py "$OUT/moe_half2_$h.json" --shapes gptoss \
          --kinds mxfp4 --tokens 1 --torch-ref-max-tokens 0 --kernels --pdl > "$OUT/moe_half2_$h.log" 2>&1
        echo "== W4_HALF2 $h"; grep -E "T=|kernels" "$OUT/moe_half2_$h.log" | cut -c1-200
      done
      for h in 1 0; do
        TRITONLLM_W4_HALF2=$h timeout 120 python3 experiments/quant4/gemv_sm90/sweep.py "$OUT/gemv_sm90_half2_$h.json" \
          --configs 8:4:0:0 4:1:1:0 16:4:0:0 8:1:1:0 2>&1 | tail -9 | sed "s/^/W4_HALF2 $h: /"
      done
      [ "$step" = half2 ] && bash "$0" half2-e2e ;;
    next-first)
      # the first call of the session after 36 (about 9 minutes): the GPU tests of the Gluon W4 GEMV (its one-block
      # kernel's code was refactored into shared helpers after session 36's GPU calls; SASS equal but for register
      # moves) and of the blocked kernel, the tiling sweep with blocks, then Llama-3-8B batch 1 bf16 / FP8 / int4 /
      # MXFP4 at today's defaults (split sampling now on: FP8 against bf16 was 1.693x without it)
      timeout 240 python3 -m pytest -q -m gpu -o addopts="" tests/kernels/test_gemv_w4_sm90.py tests/kernels/test_w4_half2.py \
        2>&1 | tail -3
      timeout 200 python3 experiments/quant4/gemv_sm90/sweep.py "$OUT/gemv_sm90_blocks.json" \
        --configs 8:4:0:0 8:4:0:0:2 8:4:0:0:4 8:4:0:0:8 4:4:0:0:4 8:4:1:0 2>&1 | tail -8
      QUANT_VARIANTS="bf16_torch fp8_gluon int4_gluon mxfp4_gluon" QUANT_EXPS=batch1_decode QUANT_TAG="_next" \
        bash "$0" e2e-quant | grep "tok/s" ;;
    stream)
      # session 37's stream-K skinny GEMM (kernels/gemm_stream_sm90.py: equal runs of (tile, K step) pairs an SM,
      # one ring across tiles; Plan field STREAM): its GPU tests and the skinny kernel's (finish_tile now shares
      # finish_part), then the plan sweep at the 16-bit M <= 16 target (gate_up 0.94-0.99x cuBLAS) and FP8 M = 1 / 4
      # (explicit plans: the sweep does not depend on TRITONLLM_SKINNY_STREAM, but its "auto" column does)
      timeout 280 python3 -m pytest -q -m gpu -o addopts="" tests/kernels/test_gemm_stream_sm90.py \
        tests/kernels/test_gemm_skinny_sm90.py 2>&1 | tail -4
      timeout 250 python3 experiments/gemm/skinny_sm90/sweep.py "$OUT/skinny_stream_bf16.json" --pdl --dtypes bf16 \
        --ms 4 8 16 --plans auto 128:1:6 128:1:12 128:1:12:4:1 128:1:6:4:2 64:1:16:4:1 64:1:8:4:2 128:1:8:8:1 \
        2>&1 | sed 's/ err [0-9.e-]*//g' | tail -12
      timeout 150 python3 experiments/gemm/skinny_sm90/sweep.py "$OUT/skinny_stream_fp8.json" --pdl --dtypes fp8 \
        --ms 1 4 --plans auto 128:1:12:4:1 128:1:6:4:2 64:1:16:4:1 64:1:8:4:2 2>&1 | sed 's/ err [0-9.e-]*//g' | tail -8 ;;
    stream-e2e)
      # session 37's opt-in plans (TRITONLLM_SKINNY_STREAM=1: 12 stages for gate_up-wide layers, stream-K for down
      # and 16-bit N >= 4096 at M = 2..16, FP8 gate_up / down at M <= 4): the GPU tests, then Llama-3-8B batch 1 bf16
      # and FP8 with them, and FP8 without (session 37, H100: 267.8 against 284.6 tok/s)
      timeout 200 python3 -m pytest -q -m gpu -o addopts="" tests/kernels/test_gemm_stream_sm90.py \
        tests/kernels/test_gemm_skinny_sm90.py -k "not every_plan and not gated and not xq and not xn" 2>&1 | tail -3
      TRITONLLM_SKINNY_STREAM=1 QUANT_VARIANTS="bf16_torch fp8_gluon" QUANT_EXPS=batch1_decode QUANT_TAG="_stream" \
        bash "$0" e2e-quant | grep "tok/s"
      QUANT_VARIANTS="fp8_gluon" QUANT_EXPS=batch1_decode QUANT_TAG="_nostream" bash "$0" e2e-quant | grep "tok/s" ;;
    next-38)
      # the first call of the session after 37 (about 9 minutes): the GPU tests changed after session 37's calls
      # (the W4 GEMV's negative check in both decodes; the stream kernel's copies split into weight / activation
      # helpers), then Llama-3-8B FP8 batch 1 with the two halves of the opt-in plans apart (both together ran
      # 267.8 against 284.6 tok/s on an H100), the FP8 step's kernel timeline with and without them, and last
      # bf16 through the default hybrid linear at 16 sequences with and without them
      timeout 150 python3 -m pytest -q -m gpu -o addopts="" tests/kernels/test_gemv_w4_sm90.py \
        tests/kernels/test_gemm_stream_sm90.py -k "broken or lost or add_c or 28672" 2>&1 | tail -3
      for mode in 0 rings stream; do
        TRITONLLM_SKINNY_STREAM=$mode QUANT_VARIANTS="fp8_gluon" QUANT_EXPS=batch1_decode QUANT_TAG="_skinny_$mode" \
          bash "$0" e2e-quant | grep "tok/s"
      done
      QUANT_VARIANTS="bf16_torch" QUANT_EXPS=batch1_decode QUANT_TAG="_next38" bash "$0" e2e-quant | grep "tok/s"
      # which kernels the plans slow down in the FP8 step (per-kernel exposed time, with and without them)
      TRITONLLM_SKINNY_STREAM=1 TIMELINE_VARIANTS=fp8 OUT="$OUT/timeline_stream" bash "$0" timeline | tail -12
      TIMELINE_VARIANTS=fp8 OUT="$OUT/timeline_nostream" bash "$0" timeline | tail -12
      ensure_config_model
      for mode in 0 1; do
        TRITONLLM_SKINNY_STREAM=$mode python3 -m tritonllm.run model.path="$MODELS/llama3-8b-config" \
          model.load_format=dummy +experiment=batch1_decode workload.num_requests=16 workload.detokenize=true \
          output_json="$OUT/llama3-8b_16x512_hybrid_skinny_$mode.json" hydra.run.dir=/tmp/hydra 2>&1 | grep "tok/s"
      done ;;
    next-39)
      # the first call of the session after 38 (about 9 minutes). Session 38 changed kernels no GPU has run: the
      # norm, RoPE, split-KV decode and Gluon W4 GEMV kernels read their constants, step inputs, the first
      # tile's older keys (split-KV) or the first K tile's weight (W4 GEMV) before the PDL wait; the 4-bit GEMM
      # has row blocks beyond 64 rows (opt-in). Their GPU tests first, then Llama-3-8B batch 1 in FP8, bf16,
      # int4 and MXFP4 (session 38, H100: FP8 285.2, bf16 166.8; session 37: int4 374.3, MXFP4 366.6 tok/s)
      timeout 200 python3 -m pytest -q -m gpu -o addopts="" tests/kernels/test_attention_split.py \
        tests/kernels/test_attention.py tests/kernels/test_rotary.py tests/kernels/test_rmsnorm.py tests/test_pdl.py \
        2>&1 | tee "$OUT/early_loads_tests.log" | tail -3
      timeout 150 python3 -m pytest -q -m gpu -o addopts="" tests/kernels/test_gemv_w4_sm90.py \
        tests/kernels/test_gemm_w4_sm90.py -k "matches or broken or every_code or row_blocks" 2>&1 \
        | tee "$OUT/w4_tests.log" | tail -3
      QUANT_VARIANTS="fp8_gluon bf16_torch int4_gluon mxfp4_gluon" QUANT_EXPS=batch1_decode QUANT_TAG="_next39" \
        bash "$0" e2e-quant | grep "tok/s" ;;
    next-42)
      # the first call of the session after 39 (about 9 minutes; ran in session 40 on an H200, its tests cut at 150 s
      # after 19 passed: the gated GEMV gains nothing measurable, experiments/quant4/README.md). Session 39 built gate_up's SiLU-mul into the
      # Gluon W4 GEMV (GATED, used with fuse_gated_activation=true at batch 1) and made one row block (M = 65..128)
      # the 4-bit GEMM's default, a single block's K split in two. Their GPU tests, then Llama-3-8B batch 1 in
      # int4 and MXFP4 with the SiLU-mul fused and not, beside bf16 cuBLAS (session 39, H100: int4 364.0, MXFP4
      # 383.4, bf16 162.2 tok/s; the SiLU-mul kernel is ~4% of the FP8 step on the H200: 119 of 2,798 us)
      timeout 200 python3 -m pytest -q -m gpu -o addopts="" tests/kernels/test_gemv_w4_sm90.py \
        tests/kernels/test_gemm_w4_sm90.py tests/test_engine_gpu.py -k "gated or row_blocks or 4bit" 2>&1 \
        | tee "$OUT/w4_tests.log" | tail -3
      QUANT_VARIANTS="bf16_torch" QUANT_EXPS=batch1_decode QUANT_TAG="_next42" bash "$0" e2e-quant | grep "tok/s"
      for fused in true false; do
        QUANT_ARGS="fuse_gated_activation=$fused" QUANT_VARIANTS="int4_gluon mxfp4_gluon" QUANT_EXPS=batch1_decode \
          QUANT_TAG="_gated_$fused" bash "$0" e2e-quant | grep "tok/s"
      done ;;
    next-43)
      # the second call (about 8 minutes): the row blocks' sweep for MXFP4 (does MAX_M = 128 hold for it?) and
      # int4 (the new split at qkv: 37.4 / 41.7 us expected at M = 65 / 128), then the W4 tests. next-44 runs the
      # float GEMM's tiles at prefill chunks (tune-mid, never run; the 4-bit prefill's GEMM reads the same tables:
      # its TTFT, 24.6 against 13.4 ms on session 39's H100)
      W4_MID_MS="65 96 128 192 256" bash "$0" w4-mid
      # the W4 GPU tests session 39's calls cut off (244 of 376 ran)
      timeout 240 python3 -m pytest -q -m gpu -o addopts="" tests/kernels/test_gemv_w4_sm90.py \
        tests/kernels/test_gemm_w4_sm90.py 2>&1 | tee "$OUT/w4_tests_all.log" | tail -3 ;;
    next-44)
      # the third call (about 8 minutes; ran in session 40 on an H200 in 78 s, its file committed): tune-mid (above)
      bash "$0" tune-mid ;;
    next-46)
      # the first call of the session after 40 (about 8 minutes): the dequantize pass's tiles (a third of the 4-bit
      # prefill's layer), the MXFP4 row blocks at M = 65..256 (is MAX_M = 128 right for MXFP4 too?), then the W4
      # GPU tests session 40's call cut off after 19 (the gated GEMV's among them)
      bash "$0" dequant-tiles
      W4_MID_FORMATS=mxfp4 W4_MID_MS="65 96 128 192 256" bash "$0" w4-mid
      timeout 240 python3 -m pytest -q -m gpu -o addopts="" tests/kernels/test_gemv_w4_sm90.py -k "gated" 2>&1 \
        | tee "$OUT/w4_gated_tests.log" | tail -3 ;;
    dequant-tiles)
      # the 4-bit prefill's dequantize pass (kernels/gemm_dequant.py) at twelve tiles, int4 g128 and MXFP4, Llama-3-8B
      # layers, L2 cold (session 40, H200: 214 us a layer at the old 64 x 256 default, ~2.6 TB/s; session 41, H100:
      # 16 x 512 best, now the default). Set gemm_dequant.TILES to the best layer total if it beats the default by
      # more than the noise
      timeout 200 python3 experiments/quant4/dequant/sweep.py "$OUT/dequant_tiles.json" 2>&1 | grep "layer:" ;;
    overlap)
      # can the 4-bit prefill's dequantize pass run beside the GEMMs? (experiments/quant4/overlap: the next linear's
      # pass on a side stream under this linear's GEMM, Llama-3-8B layers at M = 512.) Session 40, H200: no, slower
      # than in turn for the Triton GEMM and cuBLAS alike (int4 1,158 against 930 us a layer)
      timeout 100 python3 experiments/quant4/overlap/bench_overlap.py "$OUT/overlap_int4.json" --ms 512 2>&1 | tail -2
      timeout 60 python3 experiments/quant4/overlap/bench_overlap.py "$OUT/overlap_mxfp4.json" --ms 512 --mxfp4 \
        2>&1 | tail -2 ;;
    w4-mid)
      # the 4-bit GEMM's row-block plans at prefill-chunk sizes (auto: gemm_w4_sm90._rows_plan), beside today's
      # dequantize-then-GEMM ("portable") and bf16 cuBLAS; int4 g128 and MXFP4, Llama-3-8B layers, L2 cold
      for fmt in ${W4_MID_FORMATS:-int4 mxfp4}; do  # W4_MID_FORMATS: int4 and / or mxfp4
        [ "$fmt" = mxfp4 ] && flag=--mxfp4 || flag=
        timeout 200 python3 experiments/quant4/gemm_sm90/sweep.py "$OUT/w4_mid_$fmt.json" $flag \
          --ms ${W4_MID_MS:-65 128 256 512 1024 2048} --plans auto 128:1:1:8:0:0 128:1:1:8 64:1:1:4:0:0 64:2:1:4:0:0 \
          2>&1 | sed 's/ err [0-9.e-]*//g' | tail -24
      done ;;
    next-47)
      # the first call of the session after 41 (about 8 minutes, on an H200): the Qwen3 bf16 MoE prefill sweep with
      # 128-row tiles (session 41's H100: 456 TFLOP/s at 8192 tokens, the H200's table 418), its table put in place,
      # then the layer at 4096 / 8192 tokens with it (issue 16's 450). Commit $OUT's moe_<GPU>.json if it wins
      TUNE_MOE="qwen3:bfloat16" TUNE_MOE_TOKENS="4096 8192" TUNE_MOE_BLOCK_MS="64 128" timeout 420 bash "$0" tune-moe
      cp "$OUT"/moe_NVIDIA_*.json tritonllm/kernels/tuned/
      BENCH_MOE_KINDS=bfloat16 BENCH_MOE_TOKENS="8192 4096" timeout 120 bash "$0" bench-moe ;;
    next-48)
      # session 42's device call, whichever GPU comes: on an H200, next-47 then tune-mid-fp8 (issue 16's 450 TFLOP/s
      # and issue 13's FP8 batch 1, both stated on the H200); on anything else nothing (a start costs ~90 s)
      if on_h200; then
        bash "$0" next-47
        bash "$0" tune-mid-fp8
      else
        echo "not an H200: nothing run (the MXFP4 row blocks ran on session 42's H100: experiments/quant4)"
      fi ;;
    next-49)
      # session 43's device call, whichever GPU comes: on an H200, two 16 req/s serving runs and the offline step
      # (issue 15's last target, 1.2x; the next H200 call: moe-h100-tiles, then tune-mid-fp8); elsewhere, w4-default
      if on_h200; then
        RATES="16 16" OFFLINE_COUNTS=16 timeout 560 bash "$0" bench-serving
      else
        bash "$0" w4-default
      fi ;;
    w4-default)
      # session 43's defaults of the W4 GEMM (the asynchronous MMA at M <= 16 and beyond 64): its GPU tests (async,
      # scale after, default plans), then the sweep of the default against the synchronous one, and at M = 32 the
      # 128-row plan asynchronous with the activation at its step (128 registers: two programs an SM, where the
      # asynchronous plan a step ahead takes 156 and lost gate_up 52.5 against 41.3 us)
      timeout 200 python3 -m pytest -q -m gpu -o addopts="" tests/kernels/test_gemm_w4_sm90.py \
        -k "${W4_DEFAULT_TESTS:-async or default_plans or scale_after}" 2>&1 | tee "$OUT/w4_default_tests.log" | tail -3
      for fmt in int4 mxfp4; do
        [ "$fmt" = mxfp4 ] && flag=--mxfp4 || flag=
        timeout 120 python3 experiments/quant4/gemm_sm90/sweep.py "$OUT/w4_default_$fmt.json" $flag \
          --ms ${W4_DEFAULT_MS:-8 32 96} --plans auto auto_sync 128:1:1:8:0:0:1 2>&1 | sed 's/ err [0-9.e-]*//g' | tail -12
      done ;;
    w4-m64)
      # issue 14's "never slower than bf16 up to M = 64" (session 44): at M = 32 / 48 / 64 the default plans beside
      # the activation at its own step (64 rows x 4 splits; MXFP4 took it a step ahead everywhere before session 44)
      for fmt in mxfp4 int4; do
        [ "$fmt" = mxfp4 ] && flag=--mxfp4 || flag=
        timeout 150 python3 experiments/quant4/gemm_sm90/sweep.py "$OUT/w4_m64_$fmt.json" $flag --ms 32 48 64 \
          --plans auto 64:4:1:4:0:0 2>&1 | sed 's/ err [0-9.e-]*//g' | tail -12
      done ;;
    prefill-profile)
      # where a warm batch-1 prompt's step goes (512 tokens, the step that issue 13's FP8 batch 1 pays as TTFT:
      # 10.4-11.1 ms against bf16's 12.5-13.5 where FP8's GEMMs alone should take about half of bf16's): the GPU
      # kernels of one prefill step after two warm-up requests, FP8 (triton_sm90) and bf16 cuBLAS
      ensure_config_model
      for variant in ${PREFILL_VARIANTS:-fp8 bf16_torch}; do
        case $variant in
          bf16_torch) args="--kernel linear=torch" ;;
          *) args="--quantization $variant --kernel linear=triton_sm90" ;;
        esac
        python3 scripts/profile_steps.py --model "$MODELS/llama3-8b-config" --load-format dummy $args --pdl \
          --phase prefill --warmup-requests 2 --num-requests 1 --prompt-len 512 --output-len 2 --temperature 0 \
          --steps 1 --kernel-table 30 --output-json "$OUT/prefill_$variant.json" 2>&1 | grep -E '"step_ms"|gpu_busy_ms'
      done
      python3 - "$OUT" << 'PY'
import json, sys
for v in ("fp8", "bf16_torch"):
    try:
        d = json.load(open(f"{sys.argv[1]}/prefill_{v}.json"))
    except OSError:
        continue
    print(v, d["step_ms"], "ms a step;", d["gpu_busy_ms_per_step"], "ms busy")
    for name, us in d["kernels_us_per_step"].items():
        print(f"  {us:9.1f} us x{d['launches_per_step'][name]:5.1f}  {name[:90]}")
PY
      ;;
    mixed-trace)
      # issue 15: what a prompt joining 13 decodes adds to its step with the RoPE + KV write inside the piecewise
      # graphs (piecewise_rope_kv_write, session 45, opt-in) and eager beside attention (the default), and where the GPU waits for the host in
      # such a step (13 decodes + one 499-token prompt, padded to 512) and in a warm batch-1 prefill (512 tokens):
      # Chrome traces read by step_timeline.py, idle by the kernels around it; Llama-3-8B, dummy weights, cuBLAS
      ensure_config_model
      # -m gpu: the file's unmarked tests assume the CPU's engine (decode steps through the padded path too, no decode
      # graphs); on a GPU three of them fail by design (session 45's H200 call)
      timeout 200 python3 -m pytest -q -m gpu -o addopts="" tests/test_piecewise_graphs.py \
        tests/test_engine_gpu.py::test_bf16_engine_tracks_hf_float32 \
        tests/test_engine_gpu.py::test_bf16_engine_greedy_tokens_equal_hf_float32 2>&1 | tee "$OUT/mixed_tests.log" | tail -3
      for v in on off; do
        [ $v = on ] && flag= || flag=--no-piecewise-rope-kv-write
        timeout 200 python3 experiments/serving/mixed_step.py --model "$MODELS/llama3-8b-config" --load-format dummy \
          --decodes 13 --prompt-lens 499 128 --repeats 4 $flag --trace /tmp/trace_mixed_$v.json \
          --output-json "$OUT/mixed_trace_$v.json" 2>&1 | grep -E "^\{|Error"
        python3 scripts/step_timeline.py /tmp/trace_mixed_$v.json --steps 1 --gaps 12 --json "$OUT/timeline_mixed_$v.json" \
          | tee "$OUT/timeline_mixed_$v.txt" | head -40
      done
      timeout 200 python3 scripts/profile_steps.py --model "$MODELS/llama3-8b-config" --load-format dummy \
        --kernel linear=torch --pdl --phase prefill --warmup-requests 2 --num-requests 1 --prompt-len 512 \
        --output-len 2 --temperature 0 --steps 1 --trace /tmp/trace_prefill.json --output-json "$OUT/prefill_trace.json" \
        2>&1 | grep -E '"step_ms"|gpu_busy_ms'
      python3 scripts/step_timeline.py /tmp/trace_prefill.json --steps 1 --gaps 12 --json "$OUT/timeline_prefill.json" \
        | tee "$OUT/timeline_prefill.txt" | head -40 ;;
    sampling-gpu)
      # session 46's sampling features on the GPU: penalties, logit_bias and structured outputs in decode graphs with
      # overlap against eager synchronous steps, and the two kernels' conformance in bf16 (needs xgrammar and
      # apache-tvm-ffi in .whl: pip download --no-deps for cp312, beside fetch_wheels.sh's)
      timeout 200 python3 -m pytest -q -m gpu -o addopts="" tests/test_penalties.py tests/test_structured_output.py \
        tests/kernels/test_conformance.py -k "penalties or bitmask or graphs" 2>&1 | tee "$OUT/sampling_gpu.log" | tail -5 ;;
    next-57)
      # session 47's call: FP8 o_proj / down inputs per 1 x 128 group at decode (decode_group_quant) — the GPU tests
      # (the skinny GEMM's group scales, the split kernel's per-head quantization at Llama-3-8B heads, the many-program
      # quantizing SiLU-mul, the engine on and off), the batch-1 step's timeline with and without, then Llama-3-8B
      # batch 1 (512 + 128, text decoded) bf16 cuBLAS beside FP8 with and without it, twice
      timeout 200 python3 -m pytest -q -m gpu -o addopts="" tests/kernels/test_gemm_skinny_sm90.py \
        tests/kernels/test_attention_split.py tests/test_engine_gpu.py tests/kernels/test_conformance.py \
        -k "group_activation or fp8_w8a8 or dropped_scale or gpu_merge or per_head or epilogue_fused or silu_and_mul_quant" 2>&1 \
        | tee "$OUT/head_quant_gpu.log" | tail -5
      TIMELINE_VARIANTS="fp8 fp8_tok" timeout 120 bash "$0" timeline | grep window
      for r in 1 2; do
        QUANT_VARIANTS="bf16_torch fp8_gluon fp8_gluon_tok" QUANT_EXPS=batch1_decode QUANT_TAG="_s47_r$r" \
          timeout 200 bash "$0" e2e-quant
      done ;;
    next-58)
      # session 47's leftovers in one call (~7 minutes): on an H200 issue 13's batch-1 ratio with decode_group_quant on
      # and off beside bf16 cuBLAS, twice (measured on H100s only: 1.716-1.718x -> 1.732-1.736x); the structured
      # outputs' GPU tests (the in-flight tokens' copy is now waited for after the forward's launch); block-skinny
      if on_h200; then
        for r in 1 2; do
          QUANT_VARIANTS="bf16_torch fp8_gluon fp8_gluon_tok" QUANT_EXPS=batch1_decode QUANT_TAG="_s48_r$r" \
            timeout 200 bash "$0" e2e-quant
        done
      fi
      timeout 120 bash "$0" sampling-gpu
      timeout 300 bash "$0" block-skinny ;;
    next-59)
      # session 49's first call (~9 minutes). On an H200: issue 14's batch 1 (int4, MXFP4) with the register-fed GEMV
      # and with session 48's TMA-fed one (opt-in, plan 2:4) beside bf16 cuBLAS, then both GEMVs at M = 1 (int4 +
      # MXFP4, plans 0 / 2:4 / 4:2). Elsewhere (an H100): prewait
      if on_h200; then
        QUANT_VARIANTS=bf16_torch QUANT_EXPS=batch1_decode QUANT_TAG=_w4tma timeout 120 bash "$0" e2e-quant
        for v in 0 2:4; do
          TRITONLLM_W4_GEMV_TMA=$v QUANT_VARIANTS="int4_gluon mxfp4_gluon" QUANT_EXPS=batch1_decode \
            QUANT_TAG="_w4tma_${v/:/_}" timeout 200 bash "$0" e2e-quant
        done
        for v in 0 2:4 4:2; do
          TRITONLLM_W4_GEMV_TMA=$v timeout 80 python3 scripts/bench_gemm.py "$OUT/gemm_w4_tma_${v/:/_}.json" \
            --models llama3-8b --formats int4 mxfp4 --ms 1 2>&1 | grep -E "^llama3|timings" | sed "s/^/[$v] /"
        done
      else
        timeout 560 bash "$0" prewait
      fi ;;
    next-60)
      # session 49's first call (~9 minutes): moe-skinny (issue 16's decode layer), then on an H200 issue 14's int4
      # batch 1 with the register-fed GEMV and the TMA-fed one (plan 2:4) beside bf16 cuBLAS; elsewhere FP8 batch 1
      # with one weight tile before the skinny GEMM's PDL wait and with all (prewait's core)
      timeout 270 bash "$0" moe-skinny
      if on_h200; then
        QUANT_VARIANTS=bf16_torch QUANT_EXPS=batch1_decode QUANT_TAG=_w4tma timeout 110 bash "$0" e2e-quant
        for v in 0 2:4; do
          TRITONLLM_W4_GEMV_TMA=$v QUANT_VARIANTS=int4_gluon QUANT_EXPS=batch1_decode QUANT_TAG="_w4tma_${v/:/_}" \
            timeout 110 bash "$0" e2e-quant
        done
      else
        QUANT_VARIANTS=bf16_torch QUANT_EXPS=batch1_decode QUANT_TAG=_pw timeout 90 bash "$0" e2e-quant
        for pw in 16 1; do
          TRITONLLM_SKINNY_PREWAIT=$pw QUANT_VARIANTS=fp8_gluon QUANT_EXPS=batch1_decode QUANT_TAG="_pw$pw" \
            timeout 90 bash "$0" e2e-quant
        done
      fi ;;
    next-66)
      # session 52's first call (~6 minutes): rope-fold, then the Gluon MoE GEMV's GPU tests (its w2 summing its slots);
      # NEXT66_FULL=1: all of next-65 (gpt-oss's layer, gpt-oss-20b batch 1 with it) as well
      timeout 300 bash "$0" rope-fold
      timeout 100 python3 -m pytest -q -m gpu -o addopts="" tests/kernels/test_moe_gemv_sm90.py 2>&1 \
        | tee "$OUT/moe_gluon_tests.log" | tail -3
      [ -n "${NEXT66_FULL:-}" ] && timeout 250 bash "$0" next-65 ;;
    moe-layers)
      # session 53: the MoE decode layer as a model's step pays it (bench_moe --layers 8: one graph of 8 chained
      # layers, each with its own experts, over 8; with and without each layer's router) beside the one-layer graph:
      # issue 16's 70% of the touched experts' bandwidth at 1-64 tokens (Qwen3-30B-A3B), gpt-oss's MXFP4 layer
      timeout 300 python3 scripts/bench_moe.py "$OUT/moe_layers_qwen3.json" --shapes qwen3 --kinds bfloat16 fp8_block \
        --tokens 1 2 4 8 16 32 64 --torch-ref-max-tokens 0 --pdl --layers 8 2>&1 | grep -E "T=|layer of|rror" \
        | cut -c1-170 | tee "$OUT/moe_layers.log"
      timeout 150 python3 scripts/bench_moe.py "$OUT/moe_layers_gptoss.json" --shapes gptoss --kinds mxfp4 \
        --tokens 1 2 4 --torch-ref-max-tokens 0 --pdl --layers 8 2>&1 | grep -E "T=|layer of|rror" | cut -c1-170 \
        | tee -a "$OUT/moe_layers.log" ;;
    next-68)
      # session 53's plan for the next device session (two calls of ~9 minutes): rope-fold (its GPU tests, Llama-3-8B
      # batch 1 FP8 and bf16 with the fold on and off), then NEXT68_PART=2: norm-router and moe-layers
      if [ "${NEXT68_PART:-1}" = 1 ]; then
        timeout 560 bash "$0" rope-fold
      else
        timeout 260 bash "$0" norm-router
        timeout 290 bash "$0" moe-layers
      fi ;;
    s53-tests)
      # session 53's short call: the GPU tests of the two opt-in folds, never run on a GPU (RoPE into split-KV decode,
      # the MoE norm into its router)
      timeout 100 python3 -m pytest -q -o addopts="" tests/kernels/test_attention_rope.py tests/test_rope_fold.py 2>&1 \
        | tee "$OUT/rope_fold_tests.log" | tail -3
      timeout 80 python3 -m pytest -q -m gpu -o addopts="" tests/kernels/test_norm_router.py tests/test_engine_gpu.py \
        -k "norm_router or norm_in_the_moe_router" 2>&1 | tee "$OUT/norm_router_tests.log" | tail -3 ;;
    norm-router)
      # session 53: the residual add + RMSNorm before each MoE block folded into the router's launch
      # (fuse_norm_into_router, opt-in): its GPU tests, then gpt-oss-20b batch 1 with it on and off (NORM_ROUTER_FOLDS)
      timeout 200 python3 -m pytest -q -m gpu -o addopts="" tests/kernels/test_norm_router.py tests/test_engine_gpu.py \
        -k "norm_router or norm_in_the_moe_router or moe_router_fused" 2>&1 | tee "$OUT/norm_router_tests.log" | tail -3
      for fold in ${NORM_ROUTER_FOLDS:-true false}; do
        MOE_RUNS=gptoss_batch1 MOE_ARGS="fuse_norm_into_router=$fold" MOE_TAG="_norm_router_$fold" timeout 100 \
          bash "$0" e2e-moe 2>&1 | grep -E "tok/s|rror" | tail -1 | sed "s/^/fold=$fold /"
      done ;;
    next-67)
      # the batch-1 step timelines of online FP8 (with and without RoPE folded in) and bf16 cuBLAS on an H200 (its
      # last: session 25's), then issue 15 at 16 req/s (next-53)
      on_h200 && TIMELINE_VARIANTS="fp8 fp8_fold bf16_torch" timeout 280 bash "$0" timeline
      on_h200 && RATES=16 OFFLINE_COUNTS=16 timeout 340 bash "$0" bench-serving ;;
    rope-fold)
      # session 52: RoPE and the step's K/V write folded into split-KV decode (kernels/attention_rope.py,
      # fold_rope_into_attention, on by default): its GPU tests, then Llama-3-8B batch 1 bf16 cuBLAS and online FP8
      # with the fold on and off, alternated (issue 13's ratio: the rope_kv_write launch was 1.4-1.9 us a layer)
      timeout ${ROPE_FOLD_TEST_S:-150} python3 -m pytest -q -o addopts="" tests/kernels/test_attention_rope.py \
        tests/test_rope_fold.py 2>&1 | tee "$OUT/rope_fold_tests.log" | tail -3
      for variant in ${ROPE_FOLD_VARIANTS:-fp8_gluon bf16_torch}; do  # FP8's pair first: the call may be cut short
        for fold in true false; do
          QUANT_VARIANTS=$variant QUANT_EXPS=batch1_decode QUANT_ARGS="fold_rope_into_attention=$fold" \
            QUANT_TAG="_fold_$fold" timeout 100 bash "$0" e2e-quant 2>&1 | sed "s/^/$variant fold=$fold /"
        done
      done ;;
    next-65)
      # session 51's last call (~4 minutes): the Gluon MXFP4 MoE GEMV's w2 summing the slots itself (arrival counters,
      # its first weights before the PDL wait) at its own tiling (8:1): its GPU tests, gpt-oss's layer at 1 / 4 tokens
      # beside the portable GEMV, then gpt-oss-20b batch 1 end to end with it
      timeout 120 python3 -m pytest -q -m gpu -o addopts="" tests/kernels/test_moe_gemv_sm90.py 2>&1 \
        | tee "$OUT/moe_gluon_tests.log" | tail -3
      for g in 1 0; do
        TRITONLLM_MOE_GEMV_GLUON=$g timeout 60 python3 scripts/bench_moe.py "$OUT/moe_gluon_sums_$g.json" --shapes gptoss \
          --kinds mxfp4 --tokens 1 4 --torch-ref-max-tokens 0 --kernels --pdl 2>&1 | grep -E "T=|kernels" | cut -c1-120 \
          | sed "s/^/gluon=$g /" | tee -a "$OUT/moe_gluon_sums.log"
      done
      TRITONLLM_MOE_GEMV_GLUON=1 MOE_RUNS=gptoss_batch1 MOE_TAG=_s51_gluon_sums timeout 150 bash "$0" e2e-moe 2>&1 \
        | grep -E "tok/s|rror" | tail -2 ;;
    next-64)
      # session 51's second call (~9 minutes): on an H200 issue 13's FP8 batch-1 ratio (fp8_gluon beside bf16 cuBLAS,
      # decode_group_quant on: next-63's call ran out before it), then moe-gluon-tilings
      if on_h200; then
        QUANT_VARIANTS="bf16_torch fp8_gluon" QUANT_EXPS=batch1_decode QUANT_TAG=_s51 timeout 200 bash "$0" e2e-quant \
          2>&1 | tee "$OUT/fp8_b1.log" | tail -4
      fi
      timeout 330 bash "$0" moe-gluon-tilings 2>&1 | tail -40 ;;
    next-63)
      # session 51's first H100 call (~9 minutes, each part time-boxed and tee'd): next-62's H100 branch (the router's
      # GPU tests, gpt-oss-20b batch 1), then Nsight Compute on Qwen3's bf16 decode layer at one token, the register-fed
      # GEMV against the TMA-fed experts (TRITONLLM_MOE_SKINNY=1): both read ~2.2 TB/s a launch and time the same
      # (44 us), though the TMA kernel keeps far more bytes in flight: what binds them
      timeout 330 bash "$0" next-62 2>&1 | tee "$OUT/next62.log" | tail -6
      NCU_MOE=qwen3:bfloat16:1 timeout 100 bash "$0" ncu-moe 2>&1 | tee "$OUT/ncu_gemv.log" | tail -24
      mv "$OUT/ncu_moe_qwen3_bfloat16_1.txt" "$OUT/ncu_moe_qwen3_bfloat16_1_gemv.txt"
      TRITONLLM_MOE_SKINNY=1 NCU_MOE=qwen3:bfloat16:1 timeout 100 bash "$0" ncu-moe 2>&1 | tee "$OUT/ncu_skinny.log" | tail -24 ;;
    moe-gluon-tilings)
      # the Gluon MoE GEMV for MXFP4 experts (kernels/moe_gemv_sm90.py, opt-in: session 29 timed it slower than the
      # portable GEMV at gpt-oss's layer, 45 against 38 us on an H100) ran only the dense kernel's tiling, 8 rows a
      # thread with every warp along K: one K tile of 4,096 columns, of which gpt-oss's K = 2,880 fills 70%. Its
      # tilings swept here (ROWS:WARPS_K:PREFETCH:MAXNREG; warps along K 1 or 2 tile 1,024 / 2,048 columns: 94% / 70%),
      # gpt-oss's decode layer at one token beside the portable GEMV (graph replay, PDL, each kernel's time)
      for t in portable ${MOE_TILINGS:-8:4:0:0 8:1:0:0 8:1:1:0 4:1:1:0 4:1:0:0 8:2:0:0 16:2:0:0}; do
        if [ "$t" = portable ]; then env_t=(TRITONLLM_MOE_GEMV_GLUON=0); else env_t=(TRITONLLM_MOE_GEMV_GLUON=1 TRITONLLM_MOE_GEMV_SM90_TILING="$t"); fi
        env "${env_t[@]}" timeout 90 python3 scripts/bench_moe.py "$OUT/moe_gluon_${t//:/-}.json" --shapes gptoss --kinds mxfp4 \
          --tokens 1 4 --torch-ref-max-tokens 0 --kernels --pdl 2>&1 | grep -E "T=|kernels" | sed "s/^/$t /" \
          | tee -a "$OUT/moe_gluon_tilings.log"
      done ;;
    next-62)
      # session 51's first call (~9 minutes; each part time-boxed, logs tee'd to OUT so a cut call keeps them): the
      # router's GPU tests (session 50's picks within a warp: its call lost their output), then on an H200 next-60
      # (the TMA-fed MoE experts at 1 / 4 tokens: if faster there, make them the default for the H200's decode
      # buckets; int4 batch 1 with the TMA-fed 4-bit GEMV) and issue 13's batch-1 ratio once (fp8_gluon beside bf16,
      # decode_group_quant on: only H100s have timed it); elsewhere gpt-oss-20b batch 1 end to end (session 50's
      # router and the 2-token fused router untimed there)
      timeout 100 python3 -m pytest -q -m gpu -o addopts="" tests/kernels/test_moe_router.py tests/kernels/test_moe.py \
        -k "route or router or bf16_model_shapes" 2>&1 | tee "$OUT/router_gpu_tests.log" | tail -2
      if on_h200; then
        timeout 330 bash "$0" next-60 2>&1 | tee "$OUT/next60.log" | tail -30
        QUANT_VARIANTS="bf16_torch fp8_gluon" QUANT_EXPS=batch1_decode QUANT_TAG=_s51 timeout 150 bash "$0" e2e-quant
      else
        MOE_RUNS=gptoss_batch1 MOE_TAG=_s51 timeout 150 bash "$0" e2e-moe 2>&1 | tee "$OUT/gptoss_b1.log" | tail -3
      fi ;;
    next-61)
      # session 50's call (~7 minutes; it ran 215 s of it, on an H100): the routing's top-k picks as one max within a
      # warp (kernels/moe_route.py) against the build before (ROUTER_OLD: `git show 5137e80~2:tritonllm/kernels/
      # moe_route.py > old_moe_route.py`, untracked, so the call carries it; "new, old, new"),
      # router alone (graph replay) at 1 / 2 / 4 tokens, the decode layer (gpt-oss MXFP4, Qwen3 bf16 and block FP8
      # at 1 / 4 tokens, PDL; FP8 at one token takes the TMA-fed experts by default now, then with them off), then
      # gpt-oss-20b batch 1 end to end, new then old
      timeout 100 python3 -m pytest -q -m gpu -o addopts="" tests/kernels/test_moe_router.py tests/kernels/test_moe.py \
        tests/kernels/test_moe_skinny_sm90.py -k "route or router or auto or bf16_model_shapes" 2>&1 \
        | tee "$OUT/router_gpu_tests.log" | tail -2  # (session 50: a bare tail lost this when the call ran out)
      cp tritonllm/kernels/moe_route.py /tmp/new_moe_route.py
      # put build $1's moe_route.py in place: old (ROUTER_OLD) or the new one
      router_build() { if [ "$1" = old ]; then cp "$ROUTER_OLD" tritonllm/kernels/moe_route.py; else cp /tmp/new_moe_route.py tritonllm/kernels/moe_route.py; fi; }
      for build in new old new2; do
        router_build $build
        timeout 60 python3 scripts/bench_moe.py "$OUT/router_$build.json" --router-only --shapes gptoss qwen3 \
          --tokens 1 2 4 --pdl 2>&1 | grep -E "^router" | sed "s/^/[$build] /"
      done
      for build in new old; do
        router_build $build
        timeout 100 python3 scripts/bench_moe.py "$OUT/layer_gptoss_$build.json" --shapes gptoss --kinds mxfp4 \
          --tokens 1 4 --torch-ref-max-tokens 0 --pdl 2>&1 | grep -E "T=|Error" | sed "s/^/[$build] /"
        timeout 100 python3 scripts/bench_moe.py "$OUT/layer_qwen3_$build.json" --shapes qwen3 --kinds bfloat16 fp8_block \
          --tokens 1 4 --torch-ref-max-tokens 0 --pdl 2>&1 | grep -E "T=|Error" | sed "s/^/[$build] /"
      done
      router_build new
      TRITONLLM_MOE_SKINNY=0 timeout 60 python3 scripts/bench_moe.py "$OUT/layer_qwen3_fp8_skinny0.json" --shapes qwen3 \
        --kinds fp8_block --tokens 1 --torch-ref-max-tokens 0 --pdl 2>&1 | grep -E "T=|Error" | sed "s/^/[skinny0] /"
      for build in new old; do
        router_build $build
        MOE_RUNS=gptoss_batch1 MOE_TAG="_router_$build" timeout 150 bash "$0" e2e-moe
      done
      router_build new ;;
    moe-skinny)
      # session 49's MoE experts fed by a TMA ring (kernels/moe_skinny_sm90.py, opt-in TRITONLLM_MOE_SKINNY, built
      # without a GPU): its GPU tests, then the Qwen3-30B-A3B layer, bf16 and block FP8 (graph replay, router included,
      # PDL) at 1 / 4 / 64 tokens with the Triton GEMV (0) and with it (1): issue 16's 70% of the experts' bandwidth
      timeout 240 python3 -m pytest -q -m gpu -o addopts="" tests/kernels/test_moe_skinny_sm90.py 2>&1 \
        | tee "$OUT/moe_skinny_gpu.log" | tail -4
      for v in 0 1; do
        TRITONLLM_MOE_SKINNY=$v timeout 150 python3 scripts/bench_moe.py "$OUT/moe_skinny_$v.json" --shapes qwen3 \
          --kinds bfloat16 fp8_block --tokens 1 4 64 --torch-ref-max-tokens 0 --pdl 2>&1 | grep -E "T=|Error" | sed "s/^/[$v] /"
      done ;;
    w4-tma-gemv)
      # session 48's 4-bit GEMV fed by a TMA ring (kernels/gemv_w4_tma_sm90.py, opt-in TRITONLLM_W4_GEMV_TMA, built
      # without a GPU): its GPU tests, then bench_gemm at M = 1 on Llama-3-8B's layers (int4 g128, MXFP4; every
      # registered linear beside bf16 cuBLAS, L2 cold) with the register-fed GEMV (0) and the TMA one at plans
      # STAGES:PROGRAMS_PER_SM. The question for the H200 (session 48's H100: at best level with the register-fed
      # GEMV): does a deeper read in flight lift it from 2.84 TB/s toward the bf16 skinny GEMM's 4.1? Then w4-tma-e2e
      timeout 200 python3 -m pytest -q -m gpu -o addopts="" tests/kernels/test_gemv_w4_tma_sm90.py 2>&1 \
        | tee "$OUT/w4_tma_gemv_gpu.log" | tail -3
      for v in 0 2:4 2:5 3:3 4:2; do
        TRITONLLM_W4_GEMV_TMA=$v timeout 100 python3 scripts/bench_gemm.py "$OUT/gemm_w4_tma_${v/:/_}.json" \
          --models llama3-8b --formats int4 mxfp4 --ms 1 2>&1 | grep -E "^llama3|timings" | sed "s/^/[$v] /"
      done ;;
    w4-tma-e2e)
      # Llama-3-8B batch 1 (512 + 128, text decoded, dummy weights) int4 / MXFP4 with the TMA GEMV (W4_TMA_PLAN,
      # default 1: its default plan) and without, beside bf16 cuBLAS: issue 14's 2.5x
      QUANT_VARIANTS=bf16_torch QUANT_EXPS=batch1_decode QUANT_TAG=_w4tma timeout 150 bash "$0" e2e-quant
      for v in 0 "${W4_TMA_PLAN:-1}"; do
        TRITONLLM_W4_GEMV_TMA=$v QUANT_VARIANTS="int4_gluon mxfp4_gluon" QUANT_EXPS=batch1_decode \
          QUANT_TAG="_w4tma_${v/:/_}" timeout 250 bash "$0" e2e-quant
      done ;;
    prewait)
      # session 48's TRITONLLM_SKINNY_PREWAIT (the skinny GEMM's weight tiles requested before its PDL wait; all five
      # of the ring's first by default): FP8 batch 1 at 16 (today's), 1, 2 and 16 again beside bf16 cuBLAS (~8 min); the
      # step's timeline at 1 (the quantizing RMSNorm's 5.0 us exposed a launch, session 47: does it fall, and what
      # do the GEMMs after it pay?); then the skinny GEMM's GPU tests with one tile before the wait
      QUANT_VARIANTS=bf16_torch QUANT_EXPS=batch1_decode QUANT_TAG=_pw timeout 150 bash "$0" e2e-quant
      for pw in 16 1 2 16; do
        TRITONLLM_SKINNY_PREWAIT=$pw QUANT_VARIANTS=fp8_gluon QUANT_EXPS=batch1_decode QUANT_TAG="_pw$pw" \
          timeout 150 bash "$0" e2e-quant
      done
      TRITONLLM_SKINNY_PREWAIT=1 TIMELINE_VARIANTS=fp8 timeout 150 bash "$0" timeline
      TRITONLLM_SKINNY_PREWAIT=1 timeout 120 python3 -m pytest -q -m gpu -o addopts="" -k "fp8 or float8" \
        tests/kernels/test_gemm_skinny_sm90.py 2>&1 | tee "$OUT/prewait_gpu.log" | tail -3 ;;
    block-skinny)
      # session 47's block-FP8 decode GEMMs through the skinny sm90 kernel (opt-in TRITONLLM_SKINNY_BLOCK=1, built without
      # a GPU): its GPU tests, then bench_gemm at M = 1 / 4 / 16 on Llama-3-8B's layers without and with it (every
      # registered linear beside bf16 cuBLAS); make it the default in gemm_skinny_sm90.BLOCK_FP8 where it is faster
      timeout 150 python3 -m pytest -q -m gpu -o addopts="" tests/kernels/test_gemm_skinny_sm90.py -k "block_fp8" 2>&1 \
        | tee "$OUT/block_skinny_gpu.log" | tail -3
      for v in 0 1; do
        TRITONLLM_SKINNY_BLOCK=$v timeout 200 python3 scripts/bench_gemm.py "$OUT/gemm_block_skinny_$v.json" \
          --models llama3-8b --formats fp8_block --ms 1 4 16 2>&1 | tail -14
      done ;;
    next-56)
      # session 46's first call: the penalties' GPU test (decode graphs + overlap against eager synchronous
      # steps), then on an H200 moe-h100-tiles (issue 16's 450 TFLOP/s); elsewhere w4-m64. next-52's FP8 batch 1
      # and next-53's serving follow on a warm machine
      timeout 120 python3 -m pytest -q -m gpu -o addopts="" tests/test_penalties.py 2>&1 | tee "$OUT/penalties_gpu.log" | tail -3
      if on_h200; then timeout 300 bash "$0" moe-h100-tiles; else timeout 400 bash "$0" w4-m64; fi ;;
    next-55)
      # session 45's one call (~7 minutes): mixed-trace (the piecewise graphs' RoPE + KV write: GPU tests, the mixed
      # step with and without it, traces); on an H200 then one 16 req/s serving run and the offline step at 16
      # (issue 15's 1.2x) with it, random weights without a checkpoint on disk
      timeout 330 bash "$0" mixed-trace
      if on_h200; then
        ensure_config_model
        SERVE_MODEL="$MODELS/llama3-8b-config" SERVE_ARGS="--load-format dummy --piecewise-rope-kv-write" \
          OFFLINE_LOAD_FORMAT=dummy RATES=16 \
          OFFLINE_COUNTS=16 timeout 250 bash "$0" bench-serving
      fi ;;
    next-52)
      # session 44's first call: on an H200, moe-h100-tiles (issue 16's 450 TFLOP/s), then FP8 batch 1 against bf16
      # cuBLAS (issue 13's 1.7x) with the Hopper tables' new 512 buckets (the prompt's GEMMs); next-53 follows
      # (issue 15's serving). Elsewhere w4-m64 and prefill-profile
      if on_h200; then
        timeout 300 bash "$0" moe-h100-tiles
        QUANT_VARIANTS="bf16_torch fp8_gluon" QUANT_EXPS=batch1_decode QUANT_TAG=_s44 timeout 240 bash "$0" e2e-quant
      else
        bash "$0" w4-m64
        timeout 300 bash "$0" prefill-profile
      fi ;;
    next-53)
      # session 44's second H200 call: two 16 req/s serving runs and the offline step at 16 (issue 15's 1.2x)
      RATES="16 16" OFFLINE_COUNTS=16 timeout 560 bash "$0" bench-serving ;;
    next-51)
      # session 43's second H200 call (~8 minutes): moe-h100-tiles (issue 16's 450 TFLOP/s), then gemv-split
      on_h200 && timeout 300 bash "$0" moe-h100-tiles
      bash "$0" gemv-split ;;
    gemv-split)
      # the Gluon W4 GEMV's K splits (Tiling.split; session 43, built on the CPU, not yet run): their GPU tests, then
      # the sweep at 8 rows a thread in one, two and four runs, with the next tile prefetched, and today's long-K
      # tiling (int4: 16 rows), int4 g128 and MXFP4, Llama-3-8B layers at M = 1 (only down's K is past one tile),
      # L2 cold. Make the winner down's default (TILINGS' long-K entries) if it beats today's
      timeout 200 python3 -m pytest -q -m gpu -o addopts="" tests/kernels/test_gemv_w4_sm90.py -k "split" 2>&1 \
        | tee "$OUT/gemv_split_tests.log" | tail -3
      timeout 240 python3 experiments/quant4/gemv_sm90/sweep.py "$OUT/gemv_split.json" --configs 8:4:0:0 16:4:0:0 \
        8:4:0:0:1:2 8:4:0:0:1:4 8:4:1:0 16:4:0:0:1:2 2>&1 | sed 's/ err [0-9.e-]*//g' | tail -8 ;;
    next-50)
      # session 43's H200 serving and bf16 figures (~6 minutes): two 16 req/s runs on one server (each its own
      # prompts) and the offline step at 16 requests (issue 15's 1.2x), then bf16 at M = 1..16 against cuBLAS
      # (issue 13's 1.0x; bench_gemm, graph-replayed, L2 cold, no PDL)
      RATES="16 16" OFFLINE_COUNTS=16 timeout 420 bash "$0" bench-serving
      timeout 150 python3 scripts/bench_gemm.py "$OUT/gemm_bf16_m16.json" --models llama3-8b --ms 1 4 8 16 \
        --formats bf16 2>&1 | tail -17 ;;
    w4-async)
      # the W4 row blocks' ASYNC_MMA plan field (session 42, built on the CPU, not yet run): its GPU tests, then the
      # 128-row plan (today's, activation a step ahead) and the 64-row two-split plan with and without it, int4 g128
      # and MXFP4, Llama-3-8B layers at M = 65 / 96 / 128, L2 cold. Make it the rows plans' default if it wins
      timeout 150 python3 -m pytest -q -m gpu -o addopts="" tests/kernels/test_gemm_w4_sm90.py -k "async" 2>&1 \
        | tee "$OUT/w4_async_tests.log" | tail -3
      for fmt in int4 mxfp4; do
        [ "$fmt" = mxfp4 ] && flag=--mxfp4 || flag=
        timeout 150 python3 experiments/quant4/gemm_sm90/sweep.py "$OUT/w4_async_$fmt.json" $flag --ms 65 96 128 \
          --plans 128:1:1:8 128:1:1:8:0:1:1 128:1:1:8:0:0:1 64:2:1:4:0:0 64:2:1:4:0:0:1 2>&1 \
          | sed 's/ err [0-9.e-]*//g' | tail -12
      done ;;
    moe-h100-tiles)
      # issue 16's 450 TFLOP/s on an H200 in ~3 minutes (no sweep): the Qwen3 bf16 layer at 8192 / 4096 tokens with
      # the committed table, then with its 4096 / 8192 entries replaced by the H100 sweep's winners (session 42:
      # 459 TFLOP/s there); the edited table comes back in $OUT (commit it if it wins). Nothing on other GPUs
      on_h200 || { echo "not an H200: nothing run"; exit 0; }
      BENCH_MOE_KINDS=bfloat16 BENCH_MOE_TOKENS="8192 4096" BENCH_MOE_TAG=_committed timeout 150 bash "$0" bench-moe
      python3 - << 'PY'
import json, pathlib
table = pathlib.Path("tritonllm/kernels/tuned/moe_NVIDIA_H200.json")
h100 = json.loads(pathlib.Path("experiments/moe/h100_session42/moe_NVIDIA_H100_80GB_HBM3.json").read_text())
d = json.loads(table.read_text())
for t in ("4096", "8192"):
    d["bfloat16"]["128,2048,768"][t] = h100["bfloat16"]["128,2048,768"][t]
table.write_text(json.dumps(d, indent=1))
PY
      cp tritonllm/kernels/tuned/moe_NVIDIA_H200.json "$OUT/"
      BENCH_MOE_KINDS=bfloat16 BENCH_MOE_TOKENS="8192 4096" BENCH_MOE_TAG=_h100tiles timeout 150 bash "$0" bench-moe ;;
    tune-mid-fp8)
      # FP8 W8A8's tiles at prefill chunks (M = 128 / 256 / 512: the batch-1 prompt's GEMMs, where the H200's tuned
      # file had FP8 only up to M = 64 and the M-bucket tables' untimed tiles ran): tune_gemm.py's mid_fp8 suite, its
      # winners merged into this GPU's kernels/tuned/ file (brought back in $OUT: commit it), then FP8 batch 1
      # against bf16 cuBLAS end to end with them (issue 13's 1.7x)
      timeout 330 python3 scripts/tune_gemm.py "$OUT/tune_mid_fp8.json" --suites mid_fp8 2>&1 | grep -v "^compile" | tail -14
      tuned="tritonllm/kernels/tuned/$(python3 -c 'import torch; print(torch.cuda.get_device_name().replace(" ", "_"))').json"
      python3 scripts/tune_gemm.py "$OUT/tune_mid_fp8.json" --write-tuned "$tuned" --update && cp "$tuned" "$OUT/"
      QUANT_VARIANTS="bf16_torch fp8_gluon" QUANT_EXPS=batch1_decode QUANT_TAG=_midfp8 bash "$0" e2e-quant ;;
    tune-mid)
      # the float GEMM's tiles at prefill chunks (M = 128 / 256 / 512, where the M-bucket tables ran 0.65-0.95x
      # cuBLAS): scripts/tune_gemm.py's mid suite, its winners written to this GPU's kernels/tuned/ file (brought
      # back in $OUT: commit it), then bench_gemm at those sizes with them (bf16, int4, MXFP4)
      timeout 300 python3 scripts/tune_gemm.py "$OUT/tune_mid.json" --suites mid 2>&1 | grep -v "^compile" | tail -14
      tuned="tritonllm/kernels/tuned/$(python3 -c 'import torch; print(torch.cuda.get_device_name().replace(" ", "_"))').json"
      python3 scripts/tune_gemm.py "$OUT/tune_mid.json" --write-tuned "$tuned" --update && cp "$tuned" "$OUT/"
      timeout 150 python3 scripts/bench_gemm.py "$OUT/gemm_mid_tuned.json" --models llama3-8b --ms 128 512 2048 \
        --formats bf16 int4 mxfp4 2>&1 | tail -13 ;;
    skinny-nopdl)
      # bf16 skinny plans at M = 2..16 launched without PDL, as scripts/bench_gemm.py times the linears (session 38:
      # there stream-K ran 0.83-0.92x cuBLAS where the PDL sweep gave it 1.02-1.20x; today's plan 0.93-0.98x at qkv)
      timeout 200 python3 experiments/gemm/skinny_sm90/sweep.py "$OUT/skinny_nopdl.json" --dtypes bf16 --ms 2 4 8 16 \
        --shapes qkv o gate_up down --plans auto 128:1:6 128:2:6 64:1:8 64:2:8 64:4:6 128:1:12 64:1:16:4:1 \
        2>&1 | sed 's/ err [0-9.e-]*//g' | tail -16 ;;
    stream-m1)
      # the opt-in plans' untried case: 16-bit M = 1 (gpt-oss's bf16 qkv / o and Llama's layers; today's M1_FILL
      # plan against 12-16-stage rings and stream-K, one and two programs an SM)
      timeout 200 python3 experiments/gemm/skinny_sm90/sweep.py "$OUT/skinny_stream_m1.json" --pdl --dtypes bf16 \
        --ms 1 --plans auto 128:1:12 128:1:12:4:1 64:1:16:4:1 64:1:8:4:2 128:1:6:4:2 2>&1 | sed 's/ err [0-9.e-]*//g' ;;
    w4-blocks)
      # session 36's build: the Gluon W4 GEMV taking several row blocks a program where K fits one tile
      # (gemv_w4_sm90.w4_gemv_sm90_blocks_kernel, tiling field BLOCKS; the next block's weights in flight while one
      # is summed, the activations and their factor once a program: 629 sm90 instructions a block against a
      # one-block program's 1,568, int4 half pairs). Its GPU tests, the tiling sweep (Llama-3-8B at M = 1, L2 cold),
      # then Llama-3-8B int4 / MXFP4 batch 1 at the default tilings and at 4 blocks a program
      timeout 150 python3 -m pytest -q -m gpu -o addopts="" tests/kernels/test_gemv_w4_sm90.py -k "blocks or blocked" \
        2>&1 | tail -2
      timeout 200 python3 experiments/quant4/gemv_sm90/sweep.py "$OUT/gemv_sm90_blocks.json" \
        --configs 8:4:0:0 8:4:0:0:2 8:4:0:0:4 8:4:0:0:8 4:4:0:0:4 4:4:0:0:8 8:4:1:0 16:4:0:0 2>&1 | tail -8
      for t in "" "int4=8:4:0:0:4,int4_long=16:4:0:0,fp4=8:4:0:0:4"; do  # int4_long after int4 (int4 drops it)
        TRITONLLM_W4_GEMV_SM90_TILING=$t QUANT_VARIANTS="int4_gluon mxfp4_gluon" QUANT_EXPS=batch1_decode \
          QUANT_TAG="_blocks${t:+4}" bash "$0" e2e-quant | grep "tok/s" | sed "s/^/llama tiling '$t': /"
      done ;;
    half2-e2e)
      for h in ${HALF2_E2E-1 0 1 0}; do  # HALF2_E2E="": none
        TRITONLLM_W4_HALF2=$h MOE_RUNS=gptoss_batch1 MOE_TAG="_half2_$h" bash "$0" e2e-moe
      done
      for h in 0 1; do
        TRITONLLM_W4_HALF2=$h QUANT_VARIANTS="int4_gluon mxfp4_gluon" QUANT_EXPS=batch1_decode QUANT_TAG="_half2_$h" \
          bash "$0" e2e-quant | grep "tok/s" | sed "s/^/llama W4_HALF2 $h: /"
      done ;;
    moe-early)
      # session 30's build: w2's MXFP4 slot GEMV loading its expert ids and first K step's weights before its PDL
      # wait (TRITONLLM_MOE_GEMV_EARLY, moe_tiles.gemv_early): its tests, the decode layer's kernels and window
      # with PDL on (graph replay, L2 flushed) off and on, then gpt-oss-20b batch 1 off and on
      python3 -m pytest -q -o addopts="" tests/kernels/test_moe.py -k "early or load_schedules" 2>&1 | tail -2
      for e in 0 1; do
        TRITONLLM_MOE_GEMV_EARLY=$e python3 scripts/bench_moe.py "$OUT/moe_early$e.json" --shapes gptoss qwen3 \
          --kinds mxfp4 --tokens 1 --torch-ref-max-tokens 0 --kernels --pdl > "$OUT/moe_early$e.log" 2>&1
        echo "== EARLY $e"; grep -E "T=|kernels" "$OUT/moe_early$e.log" | cut -c1-200
      done
      for e in ${MOE_EARLY_E2E-1 0}; do  # MOE_EARLY_E2E="": none
        TRITONLLM_MOE_GEMV_EARLY=$e MOE_RUNS=gptoss_batch1 MOE_TAG="_early$e" bash "$0" e2e-moe
      done ;;
    ncu-moe)
      # Nsight Compute on the MoE decode GEMV (scripts/ncu_moe.py), one layer's w13 and w2 launches per NCU_MOE
      # case "shape:kind:tokens": speed of light, occupancy, launch statistics, warp stalls, memory workload
      # (caches flushed between ncu's replays: the weight read cold, as a decode step reads it)
      NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
      for case in ${NCU_MOE:-gptoss:mxfp4:1 gptoss:bfloat16:1 qwen3:bfloat16:1 qwen3:mxfp4:1}; do
        IFS=: read -r shape kind tokens <<< "$case"
        timeout 150 "$NCU" --clock-control none -k "regex:${NCU_MOE_KERNELS:-moe_gemv|moe_skinny}" --launch-skip 4 --launch-count 2 --section SpeedOfLight \
          --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \
          --section SchedulerStats python3 scripts/ncu_moe.py "$shape" "$kind" "$tokens" \
          > "$OUT/ncu_moe_${shape}_${kind}_$tokens.txt" 2>&1
        echo "== $case"; grep -E "moe_gemv_kernel|moe_skinny_sm90_kernel|Duration|DRAM Throughput|Memory Throughput|Registers Per|Achieved Occupancy|Theoretical Occupancy|Block Limit|Grid Size|Warp Cycles Per Issued|Issued Warp|No Eligible" \
          "$OUT/ncu_moe_${shape}_${kind}_$tokens.txt" | head -60
      done ;;
    ncu-w4)
      # Nsight Compute on the 4-bit GEMV at M = 1 (scripts/ncu_w4.py), register-fed (0) and TMA-fed (2:4), per
      # NCU_W4 case "layer:format": what binds it (session 48: on an H100 a deeper read in flight did not help; the
      # register-fed one-tile program's sm90 build holds 1,568 instructions, of which its one tile runs ~1,000
      # (the K loop's 562 run no iteration) for 256 weights a thread: ~3.9 a weight, ~65% of gate_up's time):
      # executed instructions, issue slots, warp stalls, DRAM throughput, occupancy
      NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
      for case in ${NCU_W4:-gate_up:int4 down:int4 gate_up:mxfp4}; do
        IFS=: read -r layer format <<< "$case"
        for v in 0 2:4; do
          TRITONLLM_W4_GEMV_TMA=$v timeout 120 "$NCU" --clock-control none -k regex:w4_gemv --launch-skip 2 \
            --launch-count 1 --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
            --section MemoryWorkloadAnalysis --section SchedulerStats --section InstructionStats \
            python3 scripts/ncu_w4.py "$layer" "$format" > "$OUT/ncu_w4_${layer}_${format}_${v/:/_}.txt" 2>&1
          echo "== $case $v"; grep -E "w4_gemv|Duration|DRAM Throughput|Registers Per|Achieved Occupancy|Block Limit|Warp Cycles Per Issued|Issued Warp|No Eligible|Executed Instructions " \
            "$OUT/ncu_w4_${layer}_${format}_${v/:/_}.txt" | head -30
        done
      done ;;
    timeline)
      # what each kernel adds to a batch-1 decode step with PDL on (scripts/step_timeline.py: exposed time, not
      # summed durations), per TIMELINE_VARIANTS (fp8: online FP8, triton_sm90 linears; fp8_xn: with
      # fuse_norm_into_gemm; bf16_torch: cuBLAS; bf16: triton_sm90); Llama-3-8B, dummy weights, 512 + 160, greedy, 20 steps traced
      ensure_config_model
      for variant in ${TIMELINE_VARIANTS:-fp8 bf16_torch}; do
        case $variant in
          bf16) args="--kernel linear=triton_sm90" ;;
          bf16_torch) args="--kernel linear=torch" ;;
          fp8_xn) args="--quantization fp8 --kernel linear=triton_sm90 --fuse-norm-into-gemm" ;;
          fp8_tok) args="--quantization fp8 --kernel linear=triton_sm90 --no-decode-group-quant" ;;  # per token
          fp8_fold) args="--quantization fp8 --kernel linear=triton_sm90 --fold-rope-into-attention" ;;
          fp8_xnmlp) args="--quantization fp8 --kernel linear=triton_sm90 --fuse-norm-into-gemm --fuse-gated-mlp" ;;
          *) args="--quantization $variant --kernel linear=triton_sm90" ;;
        esac
        python3 scripts/profile_steps.py --model "$MODELS/llama3-8b-config" --load-format dummy $args --pdl \
          --num-requests ${TIMELINE_SEQS:-1} --prompt-len 512 --output-len 160 --temperature 0 --steps 20 \
          --trace "/tmp/trace_$variant.json" --output-json "$OUT/steps_$variant.json" 2>&1 | grep -E '"step_ms"'
        python3 scripts/step_timeline.py "/tmp/trace_$variant.json" --steps 20 --json "$OUT/timeline_$variant.json" \
          | tee "$OUT/timeline_$variant.txt" | head -30
      done ;;
    host-profile)
      # py-spy host profile of nano-vllm's benchmark (overlap on), folded stacks
      ensure_model qwen3-0.6b
      PYSPY=$(command -v py-spy || echo /tmp/site/bin/py-spy)
      "$PYSPY" record -r 200 -f raw -o "$OUT/pyspy_nanovllm.txt" -- python3 scripts/bench_throughput.py \
        --model "$MODELS/qwen3-0.6b" --num-prompts 256 --input-len 562 --output-len 562 --random-range-ratio 0.82 \
        --token-id-max 10000 --temperature 0.6 --max-model-len 4096 2>&1 | tail -2 ;;
  esac
done

#!/usr/bin/env bash
# Regenerates this folder's figures from its results JSONs: bash experiments/ablations/plots.sh
set -euo pipefail
A=experiments/ablations
P="python scripts/plot.py"
Y="output_tok_per_s ttft_mean_ms tpot_mean_ms"
$P $A/qwen3-0.6b_chunked_prefill $A/qwen3-0.6b_chunked_prefill_off --x results.engine.max_num_batched_tokens --y $Y --hue scheduler.enable_chunked_prefill --bars --title "Qwen3-0.6B, nano-vllm workload: chunked prefill and the token budget (H200)" --out $A/chunked_prefill_qwen3.png
$P $A/qwen3-0.6b_cuda_graphs --x enforce_eager --hue piecewise_graphs --y $Y --bars --title "Qwen3-0.6B, nano-vllm workload: CUDA graphs (enforce_eager: none; piecewise_graphs: prefill/mixed steps too)" --out $A/cuda_graphs_qwen3.png
$P $A/llama3-8b_cuda_graphs --x enforce_eager --y decode_tok_per_s ttft_mean_ms --bars --title "Llama-3-8B, batch 1 (512 + 128): CUDA graphs on/off (H200)" --out $A/cuda_graphs_llama.png
$P $A/qwen3-0.6b_overlap --x scheduler.async_scheduling --y $Y --bars --title "Qwen3-0.6B, nano-vllm workload: overlap scheduling (H200)" --out $A/overlap_qwen3.png
$P $A/qwen3-0.6b_kv_cache_dtype $A/llama3-8b_kv_cache_dtype --x cache.kv_cache_dtype --hue model.path --y $Y --bars --title "KV cache dtype: Qwen3-0.6B nano-vllm workload, Llama-3-8B 64 x 512 + 128 (H200)" --out $A/kv_cache_dtype.png
$P $A/qwen3-0.6b_block_size --x cache.block_size --y $Y --title "Qwen3-0.6B, nano-vllm workload: KV block size (H200)" --out $A/block_size_qwen3.png
$P $A/qwen3-0.6b_attention --x kernels.attention --hue cache.kv_cache_dtype --y $Y --bars --title "Qwen3-0.6B, 64 x 512 + 128: attention implementation x KV dtype (H200)" --out $A/attention_qwen3.png
$P $A/qwen3-0.6b_attention_reference --x kernels.attention --y output_tok_per_s tpot_mean_ms --bars --title "Qwen3-0.6B, 8 x 512 + 128: Triton vs the torch reference (eager decode) (H200)" --out $A/attention_reference_qwen3.png
$P $A/qwen3-0.6b_prefix_caching --x cache.enable_prefix_caching --y output_tok_per_s mean_ttft_s prefix_cache_hit_rate --bars --title "Qwen3-0.6B, 200 requests sharing a 2,000-token prefix: prefix caching (H200)" --out $A/prefix_caching_qwen3.png
$P $A/qwen3-0.6b_policy --x scheduler.policy --y output_tok_per_s priority0_ttft_mean_ms priority1_ttft_mean_ms --bars --title "Qwen3-0.6B, nano-vllm workload, two priority levels: scheduling policy (H200)" --out $A/policy_qwen3.png

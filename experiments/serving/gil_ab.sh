#!/usr/bin/env bash
# Session 24: does the HTTP thread's hold on the GIL slow the engine thread's steps when serving?
# The server at 16 req/s (two runs, fresh prompts each) with Python's 5 ms GIL switch interval (the first run
# sampled by py-spy, GIL holders only) and with shorter ones (VARIANTS="si0.2 si1": --gil-switch-interval MS),
# then the offline reference (16 at once). Each variant's files go to $OUT/<variant>.tar.gz.
set -uo pipefail
OUT=${OUT:-gpu_out}; mkdir -p "$OUT"
bash scripts/gpu_check.sh llama3-8b-config > /dev/null 2>&1
M=/tmp/models/llama3-8b-config
for v in ${VARIANTS:-default si0.2}; do
  args="--load-format dummy"; prof=""
  case $v in default) prof=${PROFILE_S:-15} ;; si*) args="$args --gil-switch-interval ${v#si}" ;; esac
  echo "== $v ($args)"
  OUT=/tmp/gil_$v SERVE_MODEL=$M SERVE_ARGS="$args" SERVE_PROFILE=$prof RATES="16 16" NUM_PROMPTS=300 \
    OFFLINE_COUNTS="" bash scripts/gpu_check.sh bench-serving 2>&1 | grep -E "ttft|tpot|itl|failed|hit_rate|exit|rror" | head -20
  tar czf "$OUT/$v.tar.gz" -C /tmp/gil_$v .
done
echo "== offline"
OUT=/tmp/gil_offline SERVE_MODEL=$M OFFLINE_LOAD_FORMAT=dummy RATES="" OFFLINE_COUNTS=16 \
  bash scripts/gpu_check.sh bench-serving 2>&1 | grep -E "requests|rror" | head
cp /tmp/gil_offline/offline_reference.json "$OUT/"

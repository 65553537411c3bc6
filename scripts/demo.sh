#!/usr/bin/env bash
# mlakv's main job on its embedded default: installs what is missing, builds Release, and runs
# `mlakv eval` on the shipped model (models/mlakv-ds3-tiny, a DeepSeek-V3-architecture model
# trained for this project) over its held-out text: what every KV record format costs, against
# an unquantized float32 cache - KLD, top-1, perplexity, needle retrieval, speed - uncalibrated
# and with both calibration recipes fitted on text after the eval windows (fork: per-layer outer
# scales; mlakv: the calibrated latent transform, docs/quality.md). Then the same on a
# function-preserving reparametrization of the model whose cached latents have GLM-5.2-like
# magnitudes (max |kv_c_normed| 0.02 .. 5 across layers), where uncalibrated nvfp4 collapses
# and calibration restores it. Extra arguments go to the first `mlakv eval`.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
MLAKV_TARGET=mlakv_cli mlakv_configure_and_build "$ROOT/build" -DMLAKV_BUILD_TESTS=OFF -DMLAKV_BUILD_BENCH=OFF
MODEL="$ROOT/models/mlakv-ds3-tiny"
MLAKV="$ROOT/build/mlakv"

echo "== ${MODEL#$ROOT/}: every KV format against a float32 cache (held-out CPython source) =="
"$MLAKV" eval --model "$MODEL" --text "$MODEL/eval.txt" --context 2048 --windows 4 --scales auto \
  --recipe both --calib-windows 4 --needle 4 --plot "$ROOT/build/eval.svg" "$@"

echo
echo "== the same model with GLM-5.2-like latent magnitudes (function-preserving reparametrization) =="
REPARAM="$ROOT/build/mlakv-ds3-tiny-glm52-latents"
rm -rf "$REPARAM"
"$MLAKV" reparam --model "$MODEL" --out "$REPARAM" --text "$MODEL/calib.txt" --context 2048 --windows 2
"$MLAKV" eval --model "$REPARAM" --text "$MODEL/eval.txt" --context 2048 --windows 4 --scales auto \
  --recipe both --calib-windows 4 --formats fp8_ds_mla,nvfp4_ds_mla,nvfp4_ds_mla_fp8rope,nvfp4_ds_mla_int8rope,nvfp4_ds_mla+token-scale,nvfp4_ds_mla_fp8rope+token-scale,nvfp4_ds_mla_int8rope+token-scale --plot "$ROOT/build/eval-glm52-latents.svg"
echo
echo "plots: build/eval.svg, build/eval-glm52-latents.svg"

#!/usr/bin/env bash
# Kernel variants timed side by side in one short device call, without building on the GPU
# machine: the dev machine recompiles a few CUDA sources with extra -D flags (the same nvcc
# commands ninja runs), swaps those objects into a copy of libmlakv_cuda.a and relinks
# bench_cuda (and cuda_harness with VARIANT_HARNESS=1) per variant; the device runs every
# variant's bench_cuda in interleaved rounds and prints each row's mean per variant.
#
#   dev machine (after `cmake -S . -B build-cuda -G Ninja -DMLAKV_CUDA=ON -DMLAKV_CUDA_ARCHS=90a
#   -DMLAKV_BUILD_TESTS=ON -DMLAKV_BUILD_BENCH=ON && cmake --build build-cuda`):
#     bash tools/gpu_variants.sh build DIR NAME "FLAGS" [NAME "FLAGS" ...]
#       VARIANT_SOURCES  sources to recompile, relative to src/ (default: the sm90_nat
#                        instantiations and smxx/cache_writer.cu); "" flags = the tree as built
#       DIR: a folder git ignores inside the checkout (e.g. .devwork/variants), so it can be carried
#   device (carry [DIR, ".debs"]):
#     bash tools/gpu_variants.sh run DIR "BENCH ARGS" [ROUNDS]
#       e.g. "--kernel sm90_nat --shape 4,6 --no-ceilings --reps 20" or "--writers --reps 20";
#       logs under $OUT (default DIR/out). Variants whose binaries differ only in one macro
#       answer "which is faster" in one call; the harness of a candidate default runs with
#       DIR/NAME/cuda_harness --gtest_filter=... in the same call.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cmd=${1:-}
[ -n "$cmd" ] && [ $# -ge 2 ] || { sed -n 2,20p "$0"; exit 2; }
DIR=$2
shift 2

if [ "$cmd" = build ]; then
  B="$ROOT/build-cuda"
  [ -f "$B/build.ninja" ] || { echo "error: $B is not a configured CUDA build (see the usage)"; exit 2; }
  [ $(( $# % 2 )) -eq 0 ] && [ $# -ge 2 ] || { echo "error: build takes NAME \"FLAGS\" pairs"; exit 2; }
  srcs=${VARIANT_SOURCES:-"cuda/sm90/attention/instantiations/nat_bf16.cu cuda/sm90/attention/instantiations/nat_fp8_ds_mla.cu cuda/sm90/attention/instantiations/nat_nvfp4_ds_mla.cu cuda/sm90/attention/instantiations/nat_nvfp4_ds_mla_fp8rope.cu cuda/sm90/attention/instantiations/nat_nvfp4_ds_mla_int8rope.cu cuda/smxx/cache_writer.cu"}
  cmake --build "$B" --target bench_cuda cuda_harness >/dev/null
  for s in $srcs; do  # ar replaces the first member of a name: it must be this source's object
    o=$(find "$B/src/CMakeFiles" -path "*/$s.o" | head -2)
    [ "$(echo "$o" | wc -l)" = 1 ] && [ -n "$o" ] && cmp -s "$o" <(ar p "$B/src/libmlakv_cuda.a" "$(basename "$s").o") ||
      { echo "error: the first $(basename "$s").o in libmlakv_cuda.a is not src/$s's object: rename the source or relink by hand"; exit 2; }
  done
  mkdir -p "$DIR"
  DIR=$(cd "$DIR" && pwd)
  while [ $# -gt 0 ]; do
    name=$1 flags=$2
    shift 2
    out="$DIR/$name"
    rm -rf "$out"
    mkdir -p "$out/obj"
    pids=()
    for s in $srcs; do
      obj=$(basename "$s").o
      # ninja's own command for this object, with the extra flags and another output.
      c=$(cd "$B" && ninja -t commands src/libmlakv_cuda.a | grep -F -- "-c $ROOT/src/$s -o " | tail -1)
      [ -n "$c" ] || { echo "error: no build command for src/$s"; exit 2; }
      c=$(echo "$c" | sed -E "s# -MD -MT [^ ]+ -MF [^ ]+##; s# -o [^ ]+\$# -o $out/obj/$obj#; s#^ccache ##")
      (cd "$B" && eval "$c $flags" >"$out/obj/$obj.log" 2>&1) &
      pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || { echo "error: variant $name: a compile failed (see $out/obj/*.log)"; exit 1; }; done
    cp "$B/src/libmlakv_cuda.a" "$out/obj/lib.a"
    (cd "$out/obj" && ar r lib.a ./*.o)
    targets="bench/bench_cuda"
    [ "${VARIANT_HARNESS:-0}" = 1 ] && targets="$targets tests/cuda_harness"
    for t in $targets; do
      l=$(cd "$B" && ninja -t commands "$t" | tail -1)
      l=$(echo "$l" | sed -E "s#^: && ##; s# && :\$##; s# src/libmlakv_cuda.a # $out/obj/lib.a #; s# -o $t # -o $out/$(basename "$t") #")
      (cd "$B" && eval "$l")
      xz -T2 -6 -f "$out/$(basename "$t")"
    done
    echo "$flags" >"$out/FLAGS"
    git -C "$ROOT" rev-parse --short HEAD >"$out/COMMIT"
    rm -rf "$out/obj"
    echo "variant $name: $(ls "$out" | tr '\n' ' ')"
  done
  exit 0
fi

if [ "$cmd" = run ]; then
  args=${1:-"--kernel sm90_nat --no-ceilings --reps 20"}
  rounds=${2:-2}
  OUT="${OUT:-$DIR/out}"
  mkdir -p "$OUT"
  DEPS=/tmp/mlakv-deps
  mkdir -p "$DEPS"
  debs="$ROOT/.debs"
  [ -d "$debs" ] || { echo "error: no .debs directory (carry .debs)"; exit 2; }
  for f in "$debs"/*.deb; do dpkg -x "$f" "$DEPS"; done
  export LD_LIBRARY_PATH="$DEPS/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  names=()
  for d in "$DIR"/*/; do
    [ -f "$d/FLAGS" ] || continue
    for f in "$d"/*.xz; do [ -f "$f" ] && xz -dkf "$f"; done
    chmod +x "$d"/bench_cuda "$d"/cuda_harness 2>/dev/null || true
    names+=("$(basename "$d")")
  done
  [ ${#names[@]} -gt 0 ] || { echo "error: no variants under $DIR"; exit 2; }
  : >"$OUT/bench.log"
  for r in $(seq "$rounds"); do
    for n in "${names[@]}"; do
      echo "=== $n round $r" >>"$OUT/bench.log"
      # shellcheck disable=SC2086
      timeout 120 "$DIR/$n/bench_cuda" $args >>"$OUT/bench.log" 2>&1 || echo "=== $n round $r: exit $?" >>"$OUT/bench.log"
    done
  done
  for n in "${names[@]}"; do echo "$n: $(cat "$DIR/$n/FLAGS")"; done
  # Attention rows: kernel format kind B H s_q ctx topk splits ms ...; writer rows: name GB/s.
  awk -v order="${names[*]}" '/^=== /{v=$2; next}
       $1 ~ /^sm[0-9]/ && $10 ~ /^[0-9.]+$/ {k=$1" "$2" "$3" B="$4" H="$5" s_q="$6" ctx="$7" topk="$8" splits="$9; s[k SUBSEP v]+=$10; c[k SUBSEP v]++; keys[k]=1}
       $3 == "GB/s" {k="writer "$1; s[k SUBSEP v]+=$2; c[k SUBSEP v]++; keys[k]=1}
       END {n=split(order, vs, " "); for (k in keys) {line=k":"; for (i=1; i<=n; i++) if ((k SUBSEP vs[i]) in s) line=line" "vs[i]"="sprintf("%.4g", s[k SUBSEP vs[i]]/c[k SUBSEP vs[i]]); print line}}' \
    "$OUT/bench.log" | sort
  exit 0
fi
echo "error: unknown command '$cmd' (build or run)"
exit 2

#!/usr/bin/env bash
# Runs every oxidnn test binary, the demo and the cuDNN and cuBLAS (matmul) comparison
# benches on a GPU machine.
# Made by scripts/build-gpu-artifacts.sh; usage: bash gpu-artifacts/run-all.sh [log-dir]
# Set OXIDNN_SKIP_BENCH=1 to run the tests only; OXIDNN_BENCH_ONLY=cudnn or =matmul to run
# only that one of the two benches.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
logs="${1:-$here/logs}"
if [ -f "$here/bundle.tar.xz" ]; then
  work=$(mktemp -d)
  tar -xJf "$here/bundle.tar.xz" -C "$work"
  here="$work"
fi
mkdir -p "$logs"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv 2>&1 | tee "$logs/gpu.txt"
passed=0; failed=0; status=0
for t in "$here"/tests/*; do
  name=$(basename "$t")
  log="$logs/test-$name.tmp"
  "$t" --test-threads=4 >"$log" 2>&1
  rc=$?
  p=$(grep -Eo '[0-9]+ passed' "$log" | awk '{s+=$1} END {print s+0}')
  f=$(grep -Eo '[0-9]+ failed' "$log" | awk '{s+=$1} END {print s+0}')
  skipped=$(grep -c '^skipped ' "$log" || true)
  echo "test binary $name: $p passed, $f failed, $skipped skipped (rc $rc)"
  [ "$rc" -ne 0 ] && { status=1; grep -E "panicked|FAILED|rel error|left:|right:|minimal failing" -A2 "$log" | head -30; }
  { echo "=== $name"; cat "$log"; } >>"$logs/tests.log"
  rm -f "$log"
  passed=$((passed + p)); failed=$((failed + f))
done
echo "ALL TESTS: $passed passed, $failed failed"
"$here/oxidnn-demo" 2>&1 | tee "$logs/demo.log"
only="${OXIDNN_BENCH_ONLY:-}"
if [ -z "${OXIDNN_SKIP_BENCH:-}" ] && [ "$only" != matmul ] && [ -x "$here/vs_cudnn" ]; then
  OXIDNN_BENCH_CSV="$logs/bench.csv" "$here/vs_cudnn" 2>&1 | tee "$logs/bench.log" | tail -80
fi
if [ -z "${OXIDNN_SKIP_BENCH:-}" ] && [ "$only" != cudnn ] && [ -x "$here/matmul_vs_cublas" ]; then
  OXIDNN_BENCH_CSV="$logs/matmul.csv" "$here/matmul_vs_cublas" 2>&1 | tee "$logs/matmul.log" | tail -60
fi
exit $status

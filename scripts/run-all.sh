#!/usr/bin/env bash
# Runs every oxidnn test binary, the demo and every vendor comparison bench on a GPU
# machine.
# Made by scripts/build-gpu-artifacts.sh; usage: bash gpu-artifacts/run-all.sh [log-dir]
# Set OXIDNN_SKIP_BENCH=1 to run the tests only.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
logs="${1:-$here/logs}"
if [ -f "$here/bundle.tar.xz" ]; then
  work=$(mktemp -d)
  tar -xJf "$here/bundle.tar.xz" -C "$work"
  here="$work"
fi
mkdir -p "$logs"
# cuDNN from a pip wheel (PyTorch's, say) when none is on the loader's path.
if ! ldconfig -p 2>/dev/null | grep -q libcudnn.so.9; then
  cudnn=$(find /opt /usr/local /usr/lib -name libcudnn.so.9 2>/dev/null | head -1)
  [ -n "$cudnn" ] && export LD_LIBRARY_PATH="$(dirname "$cudnn")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
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
# Each comparison bench writes <name>.csv and <name>.log; OXIDNN_BENCH_ONLY=NAME runs only
# the benches whose name contains NAME (e.g. matmul, vs_cudnn, pooling).
only="${OXIDNN_BENCH_ONLY:-}"
if [ -z "${OXIDNN_SKIP_BENCH:-}" ]; then
  # PyTorch's layer/RMS norm times for norm_vs_cudnn (cuDNN's classic API has none), when
  # python3 with torch is there.
  case norm_vs_cudnn in *"$only"*)
    if [ -f "$here/torch_norms.py" ] && python3 -c 'import torch' >/dev/null 2>&1; then
      echo "=== PyTorch norms (torch_norms.py)"
      python3 "$here/torch_norms.py" "$logs/torch_norms.csv" 2>&1 | tee "$logs/torch_norms.log" | tail -30
      [ -s "$logs/torch_norms.csv" ] && export OXIDNN_TORCH_CSV="$logs/torch_norms.csv"
    else
      echo "=== PyTorch norms: no python3 with torch; norm_vs_cudnn times oxidnn's norms alone"
    fi ;;
  esac
  for b in "$here"/*vs_*; do
    [ -x "$b" ] || continue
    name=$(basename "$b")
    case "$name" in *"$only"*) ;; *) continue ;; esac
    echo "=== bench $name"
    OXIDNN_BENCH_CSV="$logs/$name.csv" "$b" 2>&1 | tee "$logs/$name.log" | tail -80
  done
fi
exit $status

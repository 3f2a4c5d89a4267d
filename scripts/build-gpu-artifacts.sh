#!/usr/bin/env bash
# Builds, on any machine (no GPU needed), every test binary, the demo and every vendor
# comparison bench (`benches/*vs_*.rs`) into gpu-artifacts/ (git-ignored), next to run-all.sh,
# which runs them all on a GPU machine:   bash gpu-artifacts/run-all.sh [output-dir]
set -euo pipefail
cd "$(dirname "$0")/.."
out=gpu-artifacts
rm -rf "$out"
mkdir -p "$out/tests"

executables() { # cargo --message-format=json on stdin -> paths of built executables
  python3 -c '
import json, sys
for line in sys.stdin:
    try: m = json.loads(line)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        print(m["target"]["kind"][0], m["target"]["name"], m["executable"])'
}

cargo test --release --no-run --message-format=json | executables | while read -r kind name exe; do
  case "$kind" in
    test|lib) cp "$exe" "$out/tests/$name" ;;
  esac
done
cargo build --release --bin oxidnn-demo
cp "${CARGO_TARGET_DIR:-target}/release/oxidnn-demo" "$out/"
if [ -z "${OXIDNN_NO_BENCH:-}" ]; then
  cargo bench --features "cudnn-bench cublas-bench" --no-run --message-format=json | executables | while read -r kind name exe; do
    if [ "$kind" = bench ]; then cp "$exe" "$out/$name"; fi
  done
fi
benches=$(cd "$out" && ls | grep -E 'vs_' || true)
strip "$out"/tests/* "$out"/oxidnn-demo $(for b in $benches; do echo "$out/$b"; done) 2>/dev/null || true
# The embedded PTX (~64 MB) is most of each ~70 MB binary, and the same in all of them: one
# xz stream with a dictionary larger than a binary stores it once, so the whole set travels
# in about 10 MB (the device tool carries at most 64 MiB), packed in under a minute at
# preset 1. One thread: xz's threads cut the stream into blocks that share no dictionary.
export XZ_OPT="${XZ_OPT:--T1 --lzma2=preset=1,dict=256MiB}"
# PyTorch's norm timings, which run-all.sh runs before the benches (norm_vs_cudnn reads them).
cp benches/torch_norms.py "$out/"
(cd "$out" && tar -cJf bundle.tar.xz tests oxidnn-demo $benches torch_norms.py && rm -rf tests oxidnn-demo $benches torch_norms.py)
cp scripts/run-all.sh "$out/run-all.sh"
du -sh "$out"
tar -tJf "$out/bundle.tar.xz"

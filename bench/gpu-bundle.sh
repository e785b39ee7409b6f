#!/usr/bin/env bash
# Packs what bench/gpu-check.sh needs to run on a bare GPU machine that can
# fetch nothing (it has the CUDA driver, runtime and libraries, but not
# Tally's build dependencies): the built GPU test, worker and benchmark
# binaries, their non-CUDA shared libraries, the examples and the dataset,
# into gpu-carry/gpu-bundle.tar.xz (ignored by git; about 43 MB, small
# enough to carry to such a machine). There (OUT: where logs go):
#   tar -xJf gpu-carry/gpu-bundle.tar.xz -C /tmp && OUT=/some/dir bash /tmp/gpu-bundle/run.sh
# It finds cuBLAS and NCCL under /usr/local, /usr/lib or /opt (toolkit or
# Python wheels) and needs about 3 minutes on one GPU.
#   bench/gpu-bundle.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
out=gpu-bundle
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib" "$out/data"
bins=("$build/tests/cuda_test" "$build/worker/tally-worker" "$build/bench/tally-bench-gpu-step")
cp "${bins[@]}" "$out/bin/"
# Shared libraries, less the C runtime and the big CUDA ones the GPU machine
# has (cuBLAS, cuBLASLt, the driver); libcudart is small and comes along.
# NCCL is loaded at run time where it is installed.
ldd "${bins[@]}" | awk '/=>/ {print $3}' | sort -u |
  grep -vE '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*)\.so|libcuda\.so|libcublas|libnccl' |
  while read -r lib; do cp -L "$lib" "$out/lib/"; done
cp -r examples "$out/"
cp /usr/share/datasets/fashion-mnist/*.gz "$out/data/"
cat > "$out/run.sh" <<'RUN'
#!/usr/bin/env bash
# GPU check from a bundle: tests, then examples on cuda:0 vs cpu:1, then the
# large-MLP step against cuBLAS. Prints a summary; with $OUT set, also
# leaves the logs there (gpu-tests.log, gpu-tests.json, gpu-summary.txt).
set -uo pipefail
cd "$(dirname "$0")"
out=${OUT:-/tmp}
# cuBLAS and NCCL from wherever this machine keeps them (toolkit, or the
# Python wheels nvidia-cublas / nvidia-nccl).
libdirs=$PWD/lib
for name in libcublas.so.13 libnccl.so.2; do
  found=$(find /usr/local /usr/lib /opt -name "$name" -not -path '*/stubs/*' 2>/dev/null | head -n 1)
  if [[ -n $found ]]; then libdirs=$libdirs:$(dirname "$found"); else echo "note: $name not found"; fi
done
export LD_LIBRARY_PATH=$libdirs:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
if ldd bin/cuda_test | grep "not found"; then echo "missing libraries (above)"; exit 1; fi
summary=()
timeout 300 bin/cuda_test --gtest_output=json:"$out/gpu-tests.json" > "$out/gpu-tests.log" 2>&1
summary+=("GPU tests (exit $?): $(grep -E '^\[ +(PASSED|FAILED|SKIPPED) +\] [0-9]+ test' "$out/gpu-tests.log" | tr '\n' ' ')")
grep -E '^\[  FAILED|Failure|error' "$out/gpu-tests.log" | head -n 20
for m in mlp cnn; do
  sed -e 's/epochs: 2/epochs: 1/' -e "s|/usr/share/datasets/fashion-mnist|$PWD/data|" \
    "examples/fashion-mnist-$m.yaml" > "/tmp/$m.yaml"
  for d in cpu:1 cuda:0; do
    timeout 120 bin/tally-worker --standalone --job=/tmp/$m.yaml --devices=$d --quiet \
      --summary_json="/tmp/$m-$d.json" > /dev/null 2>"/tmp/$m-$d.err"
    summary+=("$m $d: $(tr -d '\n ' 2>/dev/null < "/tmp/$m-$d.json" || tail -n 3 "/tmp/$m-$d.err")")
  done
done
for t in false true; do
  summary+=("large MLP step (tf32=$t): $(timeout 120 bin/tally-bench-gpu-step --steps=20 --tf32=$t 2>&1)")
done
printf '%s\n' "${summary[@]}" | tee "$out/gpu-summary.txt"
RUN
chmod +x "$out/run.sh"
mkdir -p gpu-carry
tar -cf - "$out" | xz -T0 -6 > gpu-carry/gpu-bundle.tar.xz
rm -rf "$out"
ls -la gpu-carry/gpu-bundle.tar.xz

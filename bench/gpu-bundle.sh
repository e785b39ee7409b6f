#!/usr/bin/env bash
# Packs what bench/gpu-check.sh needs to run on a bare GPU machine that can
# fetch nothing (it has the CUDA driver, runtime and libraries, but not
# Tally's build dependencies): the built GPU test, worker and benchmark
# binaries, their non-CUDA shared libraries, the examples and the dataset,
# into gpu-carry/gpu-bundle.tar.xz (ignored by git; about 43 MB, small
# enough to carry to such a machine). There:
#   tar -xJf gpu-carry/gpu-bundle.tar.xz -C /tmp && bash /tmp/gpu-bundle/run.sh
#   bench/gpu-bundle.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
out=gpu-bundle
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib" "$out/data"
bins=("$build/tests/cuda_test" "$build/worker/tally-worker" "$build/bench/tally-bench-gpu-step")
cp "${bins[@]}" "$out/bin/"
# Shared libraries, less the C runtime and CUDA's own (the GPU machine has those).
ldd "${bins[@]}" | awk '/=>/ {print $3}' | sort -u |
  grep -vE '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*)\.so|/usr/local/cuda|libcuda\.so|libcublas|libnccl|libcudart' |
  while read -r lib; do cp -L "$lib" "$out/lib/"; done
cp -r examples "$out/"
cp /usr/share/datasets/fashion-mnist/*.gz "$out/data/"
cat > "$out/run.sh" <<'RUN'
#!/usr/bin/env bash
# GPU check from a bundle: tests, then examples on cuda:0 vs cpu:1, then the
# large-MLP step against cuBLAS. Prints a summary.
set -uo pipefail
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=$PWD/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
bin/cuda_test 2>&1 | tail -n 30
for m in mlp cnn; do
  sed -e 's/epochs: 2/epochs: 1/' -e "s|/usr/share/datasets/fashion-mnist|$PWD/data|" \
    "examples/fashion-mnist-$m.yaml" > "/tmp/$m.yaml"
  for d in cpu:1 cuda:0; do
    echo "$m $d: $(bin/tally-worker --standalone --job=/tmp/$m.yaml --devices=$d --quiet 2>&1)"
  done
done
for t in false true; do bin/tally-bench-gpu-step --steps=20 --tf32=$t; done
RUN
chmod +x "$out/run.sh"
mkdir -p gpu-carry
tar -cf - "$out" | xz -T0 -6 > gpu-carry/gpu-bundle.tar.xz
rm -rf "$out"
ls -la gpu-carry/gpu-bundle.tar.xz

#!/usr/bin/env bash
# Installs every Debian 12 package Tally needs to build, test and run.
# Idempotent: when everything is present it only checks and exits.
#   install-deps.sh [--with-torch | --build-only]
set -euo pipefail

PACKAGES=(  # to build
  build-essential cmake ninja-build pkg-config git ca-certificates
  libgrpc++-dev libgrpc-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libgtest-dev libgmock-dev googletest libbenchmark-dev
  prometheus-cpp-dev        # /metrics (prometheus-cpp)
  libopenblas-dev zlib1g-dev libyaml-cpp-dev nlohmann-json3-dev
  libpng-dev libjpeg62-turbo-dev   # image_folder datasets (PNG, JPEG)
  dataset-fashion-mnist
  openssl                   # deploy/make-certs.sh (TLS certificates)
)
if [[ "${1:-}" != "--build-only" ]]; then  # to test
  PACKAGES+=(
    python3 python3-numpy curl
    python3-grpcio python3-protobuf   # the Python client's wire test
    mypy python3-typeshed     # the Python package's types (python_types)
    docker-compose iproute2   # compose-file validation, multi-host tests
    prometheus                # the scrape test (prometheus, promtool)
    clang libclang-rt-14-dev libfuzzer-14-dev   # bench/fuzz.sh (libFuzzer, sanitizers)
    chromium chromium-driver python3-selenium   # the dashboard's browser test
    # docker-compose.yml run for real (deploy/compose-check.sh)
    podman runc debootstrap containernetworking-plugins iptables
    golang-github-containernetworking-plugin-dnsname
    catatonit python3-yaml    # podman kube play's pods, deploy/k8s converted
    fortunes                  # the text example's corpus (examples/text-lm)
  )
  # The Kubernetes manifests' validation: any Node.js with npm will do.
  command -v npm > /dev/null || PACKAGES+=(nodejs npm)
fi
# `--with-torch` adds PyTorch (the Python worker, the interop test, golden
# values, benchmarks), pybind11 and Python's headers (the Python worker's
# native module) and iperf3 (the network benchmark's reference).
if [[ "${1:-}" == "--with-torch" ]]; then
  PACKAGES+=(python3-torch pybind11-dev python3-dev iperf3
             python3-torchvision python3-pil)  # the loader benchmark's reference
fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  exit 0
fi

SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null

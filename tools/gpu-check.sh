#!/usr/bin/env bash
# One prepared check for a machine with an NVIDIA GPU (docs/backends.md):
#   1. builds llama.cpp's CUDA backend (+ RPC) for this GPU's own architecture (nvidia-smi compute_cap);
#   2. serves the model from one llama-server process on the GPU, and measures model load (start -> /health
#      200) and decode speed (greedy, tokens/s);
#   3. starts two RPC workers sharing that GPU (CUDA0 each) and a master on loopback that splits the model
#      over both (--rpc, --device RPC0,RPC1, --tensor-split 1,1), and measures the same;
#   4. prints both, their ratio, and whether the greedy texts agree.
#
# usage: tools/gpu-check.sh [LLAMA_CPP_SOURCE_TARBALL] [MODEL.gguf]
#   defaults: the 0c1e570 source and SmolLM2-135M of tools/fixtures.py (LLAMA_SRC_0_3_36, LLAMA_MODEL_SMOLLM2,
#   read from .cache/fixtures.env when set). CUDA_HOME (default /usr/local/cuda) must hold nvcc and cuBLAS.
#   GPU_CHECK_DIR (default /tmp/gpu-check) holds the build (reused when there); JOBS (default nproc) compile
#   jobs; DEVICE (default CUDA0) the device both workers and the single process use.
# Everything it starts listens on 127.0.0.1 only and is stopped on exit.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
[ -f "$here/.cache/fixtures.env" ] && source "$here/.cache/fixtures.env"
src=${1:-${LLAMA_SRC_0_3_36:-}}
model=${2:-${LLAMA_MODEL_SMOLLM2:-}}
work=${GPU_CHECK_DIR:-/tmp/gpu-check}
cuda=${CUDA_HOME:-/usr/local/cuda}
jobs=${JOBS:-$(nproc)}
prompt=${PROMPT:-"The capital of France is"}
n_predict=${N_PREDICT:-128}
device=${DEVICE:-CUDA0}

die() { echo "gpu-check: $*" >&2; exit 1; }
[ -n "$src" ] && [ -f "$src" ] || die "no llama.cpp source tarball (argument 1, or LLAMA_SRC_0_3_36)"
[ -n "$model" ] && [ -f "$model" ] || die "no model (argument 2, or LLAMA_MODEL_SMOLLM2)"
command -v nvidia-smi >/dev/null || die "nvidia-smi not found: this check needs an NVIDIA GPU and its driver"
[ -x "$cuda/bin/nvcc" ] || die "no nvcc in $cuda/bin (set CUDA_HOME)"
ls "$cuda"/include/cublas_v2.h "$cuda"/targets/*/include/cublas_v2.h >/dev/null 2>&1 \
  || die "no cuBLAS headers under $cuda (install cuBLAS, or point CUDA_HOME at a toolkit that has it)"

gpu=$(nvidia-smi --query-gpu=name,memory.total,compute_cap,driver_version --format=csv,noheader | head -1)
arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d ' .')
echo "GPU: $gpu -> CMAKE_CUDA_ARCHITECTURES=$arch"
echo "nvcc: $("$cuda/bin/nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')"

# 1. Build.
mkdir -p "$work"
if [ ! -x "$work/build/bin/llama-server" ]; then
  rm -rf "$work/src" "$work/build"
  mkdir -p "$work/src"
  tar -xzf "$src" -C "$work/src" --strip-components=1
  started=$(date +%s)
  cmake -S "$work/src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DGGML_RPC=ON -DGGML_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="$arch" -DCMAKE_CUDA_COMPILER="$cuda/bin/nvcc" -DCUDAToolkit_ROOT="$cuda" \
    -DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    >"$work/cmake.log" 2>&1 || { tail -30 "$work/cmake.log"; die "cmake failed (log: $work/cmake.log)"; }
  rpc_target=$(sed -n 's/^set(TARGET \([A-Za-z0-9_-]*\)).*/\1/p' "$work/src/tools/rpc/CMakeLists.txt")
  cmake --build "$work/build" --parallel "$jobs" --target "$rpc_target" llama-server >"$work/build.log" 2>&1 \
    || { tail -30 "$work/build.log"; die "build failed (log: $work/build.log)"; }
  echo "build: $(( $(date +%s) - started )) s with $jobs jobs"
fi
bin="$work/build/bin"
for rpc_server in "$bin"/ggml-rpc-server "$bin"/rpc-server; do [ -x "$rpc_server" ] && break; done
"$bin/llama-server" --list-devices 2>/dev/null | sed 's/^/devices: /'

pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

# Seconds from the start of llama-server (its PID in $! of the caller) until /health answers 200.
wait_health() {
  local port=$1 started=$2 pid=$3
  until curl -sf -o /dev/null "http://127.0.0.1:$port/health"; do
    kill -0 "$pid" 2>/dev/null || die "llama-server on port $port exited (log: $work/server-$port.log)"
    sleep 0.05
  done
  python3 -c "import time; print(f'{time.time() - $started:.2f}')"
}

# Median decode tokens/s of three greedy completions, and the text of the last.
decode() {
  local port=$1 body speeds=() text
  body=$(python3 -c "import json,sys; print(json.dumps({'prompt': sys.argv[1], 'n_predict': int(sys.argv[2]),
    'temperature': 0, 'seed': 1, 'cache_prompt': False, 'ignore_eos': True}))" "$prompt" "$n_predict")
  curl -sf "http://127.0.0.1:$port/completion" -d "$body" >/dev/null  # warm-up
  for _ in 1 2 3; do
    answer=$(curl -sf "http://127.0.0.1:$port/completion" -d "$body")
    speeds+=("$(python3 -c "import json,sys; print(round(json.load(sys.stdin)['timings']['predicted_per_second'], 1))" <<<"$answer")")
  done
  text=$(python3 -c "import json,sys; print(json.dumps(json.load(sys.stdin)['content'][:80]))" <<<"$answer")
  echo "$(printf '%s\n' "${speeds[@]}" | sort -g | sed -n 2p) $text"
}

serve() {  # port, extra llama-server args...
  local port=$1; shift
  local started; started=$(python3 -c 'import time; print(time.time())')
  "$bin/llama-server" -m "$model" -ngl 999 -c 4096 --host 127.0.0.1 --port "$port" "$@" \
    >"$work/server-$port.log" 2>&1 &
  local pid=$!
  pids+=("$pid")
  load=$(wait_health "$port" "$started" "$pid")
  read -r tps text < <(decode "$port")
  kill "$pid"; wait "$pid" 2>/dev/null || true
}

# 2. One process.
serve 18090 --device "$device"
single_load=$load single_tps=$tps single_text=$text

# 3. Two RPC workers sharing the GPU, and a master.
for port in 50152 50153; do
  "$rpc_server" -H 127.0.0.1 -p "$port" -d "$device" >"$work/rpc-$port.log" 2>&1 &
  pids+=("$!")
done
for port in 50152 50153; do
  until (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do sleep 0.1; done
done
# The probes above connected and left: each RPC server serves one client at a time, the master next.
serve 18091 --rpc 127.0.0.1:50152,127.0.0.1:50153 --device RPC0,RPC1 --tensor-split 1,1
cluster_load=$load cluster_tps=$tps cluster_text=$text
grep -E "model buffer size" "$work/server-18091.log" | sed 's/^/cluster: /' || true

echo
echo "model: $model ($(du -h "$model" | cut -f1)), $n_predict tokens greedy, median of 3"
printf '%-34s %12s %14s\n' "" "load s" "decode tok/s"
printf '%-34s %12s %14s\n' "one process ($device)" "$single_load" "$single_tps"
printf '%-34s %12s %14s\n' "RPC cluster (2 workers on $device)" "$cluster_load" "$cluster_tps"
python3 -c "print(f'cluster / one process: decode {float(\"$cluster_tps\") / float(\"$single_tps\"):.2f}x, '
             f'load {float(\"$cluster_load\") / float(\"$single_load\"):.2f}x')"
if [ "$single_text" = "$cluster_text" ]; then
  echo "greedy text: the same ($single_text)"
else
  echo "greedy text differs: one process $single_text, cluster $cluster_text"
fi

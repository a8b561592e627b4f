#!/usr/bin/env bash
# The whole GPU check for a lent device, in one call (see issue notes): the Triton attention and rotary
# tests compiled on CUDA, then bench_gpu.py on a random-weight 1B Llama. Logs go to $OUT.
# The device image has torch, triton, transformers, safetensors and tokenizers; the engine's GPU
# path needs nothing else (grammar and GGUF packages are imported lazily).
set -o pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
timeout 180 python3 -m pytest -q -p no:cacheprovider tests/runtime/test_triton_attention.py tests/runtime/test_triton_rope.py 2>&1 | tee "$OUT/kernel_tests.log"
timeout 400 python3 benchmarks/bench_gpu.py "$@" 2>&1 | tee "$OUT/bench_gpu.log"

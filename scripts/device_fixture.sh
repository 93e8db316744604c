#!/usr/bin/env bash
# Train the embedded fixture's golden model on the lent GPU (the `device` tool) in one call.
#     run(carry=['.whl'], command='bash scripts/device_fixture.sh [STEPS]')
# Brings back $OUT/bf16.tar.gz (unpack here: tar -xzf <files_at>/bf16.tar.gz -C fixtures/tiny-qwen2-gsm/)
# and $OUT/train.log. Then, here on CPU: python scripts/make_fixture.py quantize capture (the Int4 twin
# and the CPU fp32 capture Lab 04 compares against both depend on the golden weights).
set -euo pipefail
steps=${1:-2000}
export PYTHONUNBUFFERED=1
[ -f .whl/device-install.sh ] && source .whl/device-install.sh
out=${OUT:-/tmp/out}; mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
python3 -c 'import torch, transformers, tokenizers; print("torch", torch.__version__, "transformers", transformers.__version__, "tokenizers", tokenizers.__version__)'
python3 scripts/make_fixture.py train --device cuda --steps "$steps" 2>&1 | tee "$out/train.log"
# Packed before the check, so that the trained weights come back whatever the check does.
tar -czf "$out/bf16.tar.gz" -C fixtures/tiny-qwen2-gsm bf16
# Only the golden model: the Int4 twin in the tree was made from the weights just replaced.
python3 scripts/make_fixture.py check --device cuda --n 500 --models golden 2>&1 | grep -v Warning | tee -a "$out/train.log"

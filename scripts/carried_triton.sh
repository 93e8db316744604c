#!/usr/bin/env bash
# Source this on the lent GPU to run under a newer Triton than the box's own (3.6), carried in by the
# device tool, without touching the box's torch or Triton: it is unpacked into /tmp/triton-carried and
# put first on PYTHONPATH for this shell only.
#
# Why: Gluon's TMA multicast on Hopper (the pair kernel of scripts/grouped_gluon_probe.py, round h) needs a
# Triton past 3.6.
# Triton's wheel is 286 MB and a device call carries 64 MiB with the repo, so scripts/pack_triton.sh
# packs what an NVIDIA GPU needs (libtriton.so stripped, the Python, libdevice, cuda.h; no AMD backend,
# no proton) into two xz parts, .triton-carry-a/part-a and .triton-carry-b/part-b, each carried by one
# call. A first call that carries part-a copies it to /tmp/triton-parts (the machine keeps it while it
# stays warm, 30 s between calls); the call that carries part-b unpacks both:
#     run(command='source scripts/carried_triton.sh keep && ...', carry=['.triton-carry-a'])
#     run(command='source scripts/carried_triton.sh && python3 ...', carry=['.triton-carry-b'])
# and later calls, while the machine is still warm, carry neither.
# ptxas is the box's own (CUDA 12.8, from its Triton 3.6): the carried Triton then emits PTX 8.7.
box_triton=$(python3 -c 'import triton, os; print(os.path.dirname(triton.__file__))') || return 1
mkdir -p /tmp/triton-parts
cp -f .triton-carry-?/part-? /tmp/triton-parts/ 2>/dev/null
if [ "${1:-}" = keep ]; then ls -la /tmp/triton-parts; return 0; fi
if [ ! -f /tmp/triton-carried/triton/__init__.py ]; then
    [ -f /tmp/triton-parts/part-a ] && [ -f /tmp/triton-parts/part-b ] || {
        echo "carried Triton: need both parts in /tmp/triton-parts (carry part-a, then part-b)"; ls /tmp/triton-parts; return 1; }
    mkdir -p /tmp/triton-carried && cat /tmp/triton-parts/part-a /tmp/triton-parts/part-b | xz -d | tar x -C /tmp/triton-carried || return 1
fi
export PYTHONPATH=/tmp/triton-carried${PYTHONPATH:+:$PYTHONPATH}
export TRITON_PTXAS_PATH=$box_triton/backends/nvidia/bin/ptxas TRITON_PTXAS_BLACKWELL_PATH=$box_triton/backends/nvidia/bin/ptxas
export TRITON_CACHE_DIR=/tmp/triton-cache-carried TRITON_DEFAULT_FP_FUSION=1
# backends from the carried tree only: the box's Triton 3.6 registers an AMD backend that is not carried
export TRITON_BACKENDS_IN_TREE=1
python3 -c 'import triton; print("carried Triton", triton.__version__, "from", triton.__file__)'

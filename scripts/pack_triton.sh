#!/usr/bin/env bash
# Pack a Triton wheel's NVIDIA part into .triton-carry-a/part-a and .triton-carry-b/part-b for scripts/carried_triton.sh
# (here, on the CPU machine; needs pip, strip, xz):  bash scripts/pack_triton.sh [VERSION]   (3.9.0)
set -euo pipefail
ver=${1:-3.9.0}; work=$(mktemp -d)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_27_x86_64 --platform manylinux_2_28_x86_64 -d "$work/whl" "triton==$ver"
(cd "$work" && unzip -q whl/*.whl -d wheel)
w=$work/wheel; k=$work/keep; mkdir -p "$k"
(cd "$w" && find triton -name '*.py' -not -path 'triton/backends/amd/*' -not -path 'triton/profiler/*' \
     | tar cf - -T - triton/_C/libtriton triton/backends/nvidia/driver.c triton/backends/nvidia/lib/libdevice.10.bc \
       triton/backends/nvidia/lib/gsan.ll triton/backends/nvidia/include/cuda.h triton-*.dist-info) | tar xf - -C "$k"
cp "$w/triton/_C/libtriton.so" "$k/triton/_C/" && strip --strip-all "$k/triton/_C/libtriton.so"
mkdir -p .triton-carry-a .triton-carry-b
grep -qxF '/.triton-carry-?/' .git/info/exclude || echo '/.triton-carry-?/' >> .git/info/exclude
(cd "$k" && tar cf - triton triton-*.dist-info) | xz --x86 --lzma2=preset=9e,dict=256MiB > "$work/t.tar.xz"
half=$(( ($(stat -c %s "$work/t.tar.xz") + 1) / 2 ))
head -c "$half" "$work/t.tar.xz" > .triton-carry-a/part-a
tail -c +"$((half + 1))" "$work/t.tar.xz" > .triton-carry-b/part-b
ls -la .triton-carry-a .triton-carry-b; rm -rf "$work"

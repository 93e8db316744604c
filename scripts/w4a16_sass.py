"""What the W4A16 kernel's main loop executes on an NVIDIA GPU, read from its machine code, without a GPU.

    python scripts/w4a16_sass.py [--arch 90] [--unpack reshape join ptx fragment] [--block-n 64] [--warps 4] [--stages 3]
        [--split-k 4] [--last-sum] [--one-row] [--gated] [--out DIR]

Triton compiles a kernel for a target it is told (--arch: 90 the H100/H200, 89 the RTX 4090) with its own bundled ptxas, and
its bundled nvdisasm prints the machine code (SASS). Per unpacking: the instructions of the K loop's body
(one 64 x 128 weight tile per program and step; 'fragment' is the Gluon kernel: 4 warps, --block-n 64 or 128,
--stages 1 or 2 steps loaded ahead into registers, from 3 a ring of that many slots in shared memory),
counted by kind: the tensor-core products (HGMMA: wgmma, HMMA: mma.sync), global loads into registers
(LDG) or straight into shared memory (LDGSTS: cp.async), the shared-memory traffic (STS, LDS, LDSM) and
barriers, the unpacking's integer and packed-fp16 work (LOP3, SHF, PRMT, HADD2, HMUL2), and the registers
a thread holds (cuobjdump: they set how many programs fit an SM). Weights per thread and step are
BLOCK_N * BLOCK_K / threads, so instructions per weight follow. The Triton here may be newer than a GPU
box's: its code can differ in detail. --out: the SASS and a table (sass_<unpack>.txt, w4a16_sass.md).
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

KINDS = ("HGMMA", "HMMA", "LDGSTS", "LDG", "LDS", "LDSM", "STS", "BAR", "LOP3", "SHF", "PRMT", "HADD2", "HMUL2",
         "IMAD", "LEA")
OP = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]\s+)?([A-Z][A-Z0-9]*)")


def compile_sass(unpack: str, block_n: int, warps: int, stages: int, arch: int = 90, gated: bool = False,
                 pdl: bool = False, one_row: bool = False, split_k: int = 4, last_sum: bool = False) -> tuple[str, int]:
    """The kernel at Qwen2.5-7B's gate/up tile (K block 128, group 128, fp16, v1 zeros) compiled for sm_<arch>;
    gated: gate and up in one (w4a16_gated_silu); pdl: with its sum kernel's programmatic launch; one_row:
    the Gluon kernel as a one-row call runs it (M = 1 is compiled apart); last_sum: with its split-K sum in its last
    program (w4a16_fragment.last_sum). Returns the SASS and the registers a
    thread holds (they set how many programs fit an SM)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from utils.kernels.w4a16 import UNPACKS, V1_ZERO_WORD
    from utils.kernels.w4a16_kernels import w4a16_kernel

    sig = {"x_ptr": "*fp16", "qw_ptr": "*i32", "qz_ptr": "*i32", "s_ptr": "*fp16", "g_ptr": "*i32",
           "b_ptr": "*fp16", "y_ptr": "*fp16", "part_ptr": "*fp32", "qw2_ptr": "*i32", "qz2_ptr": "*i32",
           "s2_ptr": "*fp16", "b2_ptr": "*fp16", "M": "i32", "K": "i32", "N": "i32", "stride_xm": "i32"}
    aligned = {(i,): [["tt.divisibility", 16]] for i in (*range(12), 13, 14, 15)}
    if unpack == "fragment":                 # the Gluon kernel (sm_80+; 64 or 128 columns, 4 warps)
        from triton.experimental.gluon._runtime import GluonASTSource

        from utils.kernels import w4a16_fragment
        if w4a16_fragment.w4a16_fragment_kernel is None:
            raise SystemExit(f"--unpack fragment: Triton {triton.__version__} has no Gluon with mma_v2 (3.6 or later)")
        # as w4a16.W4A16Plan makes it: one row (M = 1, compiled apart) with x loaded by each warp; 16 rows with x
        # read once per program into shared memory (at depth 1)
        sig["count_ptr"] = "*i32"
        consts = dict(GROUP=128, ZP_ADD=V1_ZERO_WORD, HAS_BIAS=False, BLOCK_M=16, BLOCK_N=block_n, SPLIT_K=split_k,
                      GATED=gated, LAST_SUM=last_sum, SUM_ROWS=1 if one_row else 16,
                      **w4a16_fragment.pipeline(1 if one_row else 16, stages))
        if one_row:
            consts["M"] = 1
        sig.update({k: "constexpr" for k in consts})
        k = triton.compile(GluonASTSource(w4a16_fragment.w4a16_fragment_kernel, sig, consts, aligned),
                           target=GPUTarget("cuda", arch, 32), options=dict(num_warps=4))
    else:
        consts = dict(GROUP=128, ZP_ADD=V1_ZERO_WORD, ACT_ORDER=False, HAS_BIAS=False, BLOCK_M=16, BLOCK_N=block_n,
                      BLOCK_K=128, SPLIT_K=split_k, PRECISION=None, UNPACK=UNPACKS.index(unpack), GATED=gated, PDL=pdl)
        sig.update({k: "constexpr" for k in consts})
        k = triton.compile(ASTSource(w4a16_kernel, sig, consts, aligned), target=GPUTarget("cuda", arch, 32),
                           options=dict(num_warps=warps, num_stages=stages))
    tools = Path(triton.backends.nvidia.__file__).parent / "bin"
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        cubin.write_bytes(k.asm["cubin"])
        sass = subprocess.run([str(tools / "nvdisasm"), "-c", str(cubin)], check=True, capture_output=True, text=True).stdout
        usage = subprocess.run([str(tools / "cuobjdump"), "--dump-resource-usage", str(cubin)], check=True,
                               capture_output=True, text=True).stdout
    return sass, int(re.search(r"REG:(\d+)", usage).group(1))


def loop_body(sass: str) -> list[str]:
    """The instructions of the longest backward branch's body: the K loop."""
    lines = sass.splitlines()
    labels = {ln.strip()[:-1]: i for i, ln in enumerate(lines) if ln.strip().startswith(".L_") and ln.strip().endswith(":")}
    best = []
    for i, ln in enumerate(lines):
        m = re.search(r"BRA `\((\.L_x_\d+)\)", ln)
        if m and labels.get(m.group(1), i) < i and i - labels[m.group(1)] > len(best):
            best = lines[labels[m.group(1)]:i + 1]
    return [OP.search(ln).group(1) for ln in best if OP.search(ln)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--unpack", nargs="+", default=["reshape", "join", "ptx"], choices=("reshape", "rows", "join", "ptx", "fragment"))
    ap.add_argument("--block-n", type=int, default=64)
    ap.add_argument("--warps", type=int, default=4)
    ap.add_argument("--stages", type=int, default=3)
    ap.add_argument("--arch", type=int, default=90, choices=(80, 86, 89, 90),
                    help="compute capability x 10: 90 H100/H200, 89 RTX 4090, 86 RTX 3090, 80 A100")
    ap.add_argument("--gated", action="store_true", help="gate and up in one program (w4a16_gated_silu)")
    ap.add_argument("--pdl", action="store_true", help="with the sum kernel's programmatic dependent launch")
    ap.add_argument("--one-row", action="store_true", help="the Gluon kernel as a one-row call runs it")
    ap.add_argument("--split-k", type=int, default=4, help="ranges of K steps (programs per column block)")
    ap.add_argument("--last-sum", action="store_true", help="the Gluon kernel's split-K sum in its last program")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.block_n < 16 or args.block_n & (args.block_n - 1):
        ap.error(f"--block-n: {args.block_n} must be a power of two >= 16 (the columns of one program's tile)")
    if args.split_k < 1:
        ap.error(f"--split-k must be >= 1 (ranges of K steps per column block), got {args.split_k}")
    if args.last_sum and "fragment" not in args.unpack:
        ap.error("--last-sum is the Gluon kernel's: pass --unpack fragment with it")
    if args.warps not in (1, 2, 4, 8, 16) or args.stages < 1:
        ap.error(f"--warps must be 1, 2, 4, 8 or 16 and --stages >= 1, got {args.warps} and {args.stages}")
    os.environ["TRITON_INTERPRET"] = "0"
    per_thread = args.block_n * 128 * (2 if args.gated else 1) // (32 * args.warps)
    rows = ["| unpack | registers per thread | loop instructions per thread | per weight | " + " | ".join(KINDS) + " |",
            "|" + "---|" * (4 + len(KINDS))]
    for unpack in args.unpack:
        sass, regs = compile_sass(unpack, args.block_n, args.warps, args.stages, args.arch, args.gated, args.pdl,
                                  args.one_row, args.split_k, args.last_sum)
        ops = loop_body(sass)
        n = collections.Counter(ops)
        rows.append(f"| {unpack} | {regs} | {len(ops)} | {len(ops) / per_thread:.2f} | "
                    + " | ".join(str(n[k]) for k in KINDS) + " |")
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / f"sass_{unpack}.txt").write_text(sass)
    import triton
    text = (f"W4A16 kernel's K loop on sm_{args.arch} (Triton {triton.__version__}, compiled here): tile {args.block_n} x 128, "
            f"{args.warps} warps, {args.stages} stages{', gated' if args.gated else ''}, {per_thread} weights per thread "
            "and step.\n\n" + "\n".join(rows) + "\n")
    if args.out:
        (args.out / "w4a16_sass.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

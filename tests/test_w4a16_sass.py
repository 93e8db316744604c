"""The W4A16 kernel compiled for NVIDIA GPUs here, without one (scripts/w4a16_sass.py): the PTX unpacking,
which Triton's interpreter cannot run, must assemble for the H100 and the RTX 4090, and do what it is for."""
import collections
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
sys.path.insert(0, str(SCRIPTS))
import w4a16_sass  # noqa: E402


def compile_sass(arch, out, *args):
    """scripts/w4a16_sass.py in its own process (the kernels compiled, not interpreted as this suite imports
    them), its SASS and table written to `out`."""
    subprocess.run([sys.executable, str(SCRIPTS / "w4a16_sass.py"), "--arch", str(arch), *args, "--out", str(out)],
                   check=True, env={**os.environ, "TRITON_INTERPRET": "0"}, capture_output=True, timeout=240)


@pytest.mark.parametrize("arch,tensor_op", [(90, "HGMMA"), (89, "HMMA")])
def test_ptx_unpacking_assembles_and_takes_fewer_instructions_than_joins(arch, tensor_op, tmp_path):
    compile_sass(arch, tmp_path, "--unpack", "join", "ptx")
    loops = {u: w4a16_sass.loop_body((tmp_path / f"sass_{u}.txt").read_text()) for u in ("join", "ptx")}
    for unpack, ops in loops.items():
        assert tensor_op in ops, (arch, unpack)                 # the tile product on the tensor cores
    assert loops["ptx"].count("LOP3") < loops["join"].count("LOP3")   # two codes per lop3, not one
    assert len(loops["ptx"]) < len(loops["join"])
    assert f"sm_{arch}" in (tmp_path / "w4a16_sass.md").read_text()



@pytest.mark.parametrize("arch", [90, 89])
def test_the_fragment_kernel_moves_no_unpacked_weight_through_shared_memory(arch, tmp_path):
    # the unpacked words are already the mma's A operand (the kernel asserts the layout conversion is trivial):
    # no unpacked weight goes through shared memory, where the Triton kernel's loop stores and ldmatrix-loads
    # it. In the register loop (--stages 1) at 16 rows shared memory carries only x, read once per program and
    # step (16 rows x 128: two 16-byte stores a thread) for all four warps (each its B fragments, eight 16-byte
    # loads)
    from utils.kernels import w4a16_fragment
    if w4a16_fragment.w4a16_fragment_kernel is None:
        pytest.skip("this Triton's Gluon has no mma_v2 (3.6 or later): the Triton kernel serves every call")
    for gated in (False, True):
        out = tmp_path / str(gated)
        compile_sass(arch, out, "--unpack", "ptx", "fragment", "--stages", "1", *(["--gated"] if gated else []))
        sass = (out / "sass_fragment.txt").read_text()
        ops = w4a16_sass.loop_body(sass)
        assert ops.count("HMMA") == (32 if gated else 16), (arch, gated)     # 64 x 16 x 128 in m16n8k16 per warp
        assert (ops.count("STS"), ops.count("LDS"), ops.count("LDSM")) == (2, 8, 0), (arch, gated)
        assert "LDSM" not in w4a16_sass.OP.findall(sass)
        assert "LDG.E.128" in sass                                         # x: 16 bytes a load
        assert {"STS", "LDSM"} <= set(w4a16_sass.loop_body((out / "sass_ptx.txt").read_text()))
        # one row (compiled apart): each warp loads its own x, and no shared memory at all
        one = tmp_path / f"{gated}-one-row"
        compile_sass(arch, one, "--unpack", "fragment", "--stages", "1", "--one-row", *(["--gated"] if gated else []))
        kernel = w4a16_sass.OP.findall((one / "sass_fragment.txt").read_text())
        assert not {"STS", "LDS", "LDSM", "BAR"} & set(kernel), (arch, gated)


@pytest.mark.parametrize("arch", [90, 89])
def test_the_ring_streams_the_weight_into_shared_memory_without_registers(arch, tmp_path):
    # from RING_ROWS rows a K step's words, zero words, scales and x go by cp.async (LDGSTS, 16 bytes where
    # they can) into a ring slot: no global load into registers in the loop, one barrier a step, nothing
    # stored by threads; so the next steps' bytes hold no registers, and a thread needs far fewer than when
    # the next step's words wait in registers (more programs fit an SM)
    from utils.kernels import w4a16_fragment
    if w4a16_fragment.w4a16_fragment_kernel is None:
        pytest.skip("this Triton's Gluon has no mma_v2 (3.6 or later): the Triton kernel serves every call")
    regs = {}
    for stages in (1, w4a16_fragment.RING_STAGES):
        out = tmp_path / str(stages)
        compile_sass(arch, out, "--unpack", "fragment", "--block-n", "128", "--stages", str(stages))
        row = next(ln for ln in (out / "w4a16_sass.md").read_text().splitlines() if ln.startswith("| fragment"))
        regs[stages] = int(row.split("|")[2])
        ops = w4a16_sass.loop_body((out / "sass_fragment.txt").read_text())
        assert ops.count("HMMA") == 32, (arch, stages)               # 128 x 16 x 128 in m16n8k16 per warp
        if stages > 1:
            assert "LDG" not in ops and "STS" not in ops and ops.count("BAR") == 1, (arch, collections.Counter(ops))
            assert ops.count("LDGSTS") >= 4                          # 8 KB of words: four 16-byte copies a thread
            assert "LDGSTS.E.BYPASS.128" in (out / "sass_fragment.txt").read_text()
    assert regs[w4a16_fragment.RING_STAGES] < 0.7 * regs[1], regs

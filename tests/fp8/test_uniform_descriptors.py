"""wgmma descriptors on the uniform datapath. fwd v13 (LAB_FWD_FP8_WARP_UNIFORM): in the SASS of the
warp-specialised kernel, the issue blocks of the ping-pong turns (from the turn's BAR.SYNC to the pass's BAR.ARV,
the ones holding a GMMA) move no descriptor from a vector register (R2UR), in the one-CTA-per-tile grid and the
persistent one (the default); with the switch off the persistent build does (the test can tell the two apart).
bwd v22 (LAB_BWD_FP8_LEAN): fewer R2UR than the build before, and no float division left but the four outside
its loop. Needs nvcc and cuobjdump (CUOBJDUMP names it), else skipped."""
from __future__ import annotations

import collections
import os
import re
import shutil
import subprocess

import pytest

from lab import build, paths
from lab.profile import sass_loops

TURN = re.compile(r"^BAR\.SYNC")  # named barrier with a register id: the consumers' turn
PASS = re.compile(r"^BAR\.ARV")


def issue_blocks(instrs) -> list[dict]:
    """Per turn that issues wgmma: its instruction count, wgmma count and R2UR count."""
    blocks, start = [], None
    for i, (_, opcode, operands) in enumerate(instrs):
        if TURN.match(opcode) and re.fullmatch(r"R\d+, 0x100", operands.strip()):
            start = i
        elif PASS.match(opcode) and start is not None:
            block = instrs[start:i + 1]
            gmma = sum("GMMA" in op for _, op, _ in block)
            if gmma:
                blocks.append({"n": len(block), "gmma": gmma, "r2ur": sum(op == "R2UR" for _, op, _ in block)})
            start = None
    return blocks


LISTING = """
        Function : ws_kernel
        /*0000*/                   BAR.SYNC.DEFER_BLOCKING R15, 0x100 ;
        /*0010*/                   UIADD3 UR8, UR30, 0x4000, URZ ;
        /*0020*/                   WARPGROUP.ARRIVE ;
        /*0030*/                   QGMMA.64x192x32.F32.E4M3.E4M3 R24, gdesc[UR8], RZ, !UPT ;
        /*0040*/                   R2UR UR10, R212 ;
        /*0050*/                   QGMMA.64x128x32.F32.E4M3.E4M3 R120, R184, gdesc[UR8], R120, gsb0 ;
        /*0060*/                   BAR.ARV R13, 0x100 ;
        /*0070*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*0080*/                   BAR.SYNC.DEFER_BLOCKING R9, 0x100 ;
        /*0090*/                   FADD R1, R2, R3 ;
        /*00a0*/                   BAR.ARV R9, 0x100 ;
"""


def test_issue_blocks_of_a_listing():
    """One turn with two wgmma and one R2UR; a turn without wgmma and the CTA-wide barrier are not counted."""
    funcs = sass_loops.functions(LISTING)
    assert issue_blocks(funcs["ws_kernel"]) == [{"n": 7, "gmma": 2, "r2ur": 1}]


def _functions(defines: dict, tmp_path, source: str, kernel: str) -> dict:
    """{function name: its instructions} of the functions named like `kernel` in `source`'s sm_90a SASS."""
    nvcc, cuobjdump = shutil.which("nvcc"), shutil.which(os.environ.get("CUOBJDUMP", "cuobjdump"))
    if nvcc is None or cuobjdump is None:
        pytest.skip("needs nvcc and cuobjdump (CUOBJDUMP=/path/to/cuobjdump)")
    name = "_".join(f"{k}{v}" for k, v in sorted(defines.items())) or "default"
    cubin = tmp_path / f"{kernel}-{name}.cubin"
    flags = [*build.BASE_FLAGS, *build.check_arch_flags("sm_90a"), *(f"-D{k}={v}" for k, v in defines.items())]
    subprocess.run([nvcc, *flags, "-cubin", source, "-o", str(cubin)], cwd=paths.ROOT, check=True,
                   capture_output=True)
    text = subprocess.run([cuobjdump, "-sass", str(cubin)], check=True, capture_output=True, text=True).stdout
    return {name: instrs for name, instrs in sass_loops.functions(text).items() if kernel in name}


def _sass(defines: dict, tmp_path) -> dict:
    return {name: issue_blocks(instrs) for name, instrs in
            _functions(defines, tmp_path, "kernels/fwd/v13_fp8.cu", "attn_fwd_v13_ws_kernel").items()}


@pytest.mark.parametrize("defines", [{"LAB_FWD_FP8_PERSISTENT": 0}, {"LAB_FWD_FP8_PERSISTENT": 1}],
                         ids=["one-cta-per-tile", "persistent"])
def test_the_turns_keep_their_descriptors_uniform(defines, tmp_path):
    kernels = _sass(defines, tmp_path)
    assert len(kernels) == 2  # D 128 and D 256 (D 64 runs the one-warpgroup kernel)
    for name, blocks in kernels.items():
        assert len(blocks) == 3, (name, blocks)  # first S, the main loop's S + P V, the last P V
        assert all(b["r2ur"] == 0 for b in blocks), (name, blocks)


def test_without_the_shuffle_the_persistent_turns_move_descriptors(tmp_path):
    kernels = _sass({"LAB_FWD_FP8_PERSISTENT": 1, "LAB_FWD_FP8_WARP_UNIFORM": 0}, tmp_path)
    main_loop = [blocks[1] for blocks in kernels.values()]
    assert all(b["r2ur"] >= b["gmma"] for b in main_loop), main_loop  # at least one R2UR per wgmma


def _opcodes(instrs) -> collections.Counter:
    return collections.Counter(opcode.split(".")[0] for _, opcode, _ in instrs)


def test_the_fp8_backward_keeps_descriptors_uniform_and_divides_outside_its_loop(tmp_path):
    """bwd v22 at D 64 and 128: the lean build moves fewer descriptors from vector registers than the build before
    and keeps four float divisions (FCHK, the IEEE division's check), all outside the loop: K's descale over 448
    before it, the epilogue's three after it; the build before also divided twice in every dQ step."""
    lean = _functions({}, tmp_path, "kernels/bwd/v22_fp8.cu", "bwd_fp8_kernel")
    before = _functions({"LAB_BWD_FP8_LEAN": 0}, tmp_path, "kernels/bwd/v22_fp8.cu", "bwd_fp8_kernel")
    assert len(lean) == len(before) == 2  # D 64 and D 128
    for name in lean:
        ops_lean, ops_before = _opcodes(lean[name]), _opcodes(before[name])
        assert ops_lean["FCHK"] <= 4 < ops_before["FCHK"], (name, ops_lean["FCHK"], ops_before["FCHK"])
        assert ops_lean["R2UR"] < ops_before["R2UR"], (name, ops_lean["R2UR"], ops_before["R2UR"])

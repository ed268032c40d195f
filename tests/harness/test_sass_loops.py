"""lab.profile.sass_loops on a synthetic cuobjdump listing: loops are found by their backward branch, counted
by pipe, and turned into floors with the wgmma shapes."""
from lab.profile import sass_loops

LISTING = """
        Function : kernel_a
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   HGMMA.64x176x16.F32 R24, gdesc[UR16], RZ, !UPT ;
        /*0020*/                   FMNMX R2, R3, R4, !PT ;
        /*0030*/                   MUFU.EX2 R5, R6 ;
        /*0040*/                   FFMA R7, R8, R9, R10 ;
        /*0050*/                   HGMMA.64x128x16.F32 R24, R4, gdesc[UR8], R24 ;
        /*0060*/              @!P0 BRA 0x10 ;
        /*0070*/                   EXIT ;
        Function : kernel_b
        /*0000*/                   FADD R1, R2, R3 ;
        /*0010*/                   BRA 0x0 ;
"""


def test_loops_and_floors_of_a_listing():
    funcs = sass_loops.functions(LISTING)
    assert set(funcs) == {"kernel_a", "kernel_b"} and len(funcs["kernel_a"]) == 8
    (start, end, classes, ops, mma_clocks), = sass_loops.loops(funcs["kernel_a"])
    assert (start, end) == (0x10, 0x60)
    assert classes == {"tensor": 2, "fp32": 2, "mufu": 1, "branch": 1}
    assert mma_clocks == (64 * 176 * 16 + 64 * 128 * 16) / 2048
    floors = sass_loops.floors(classes, mma_clocks)
    assert floors["issue"] == 6 and floors["mufu"] == 8 and floors["fp32"] == 2 and floors["tensor (SM)"] == 152
    assert sass_loops.loops(funcs["kernel_b"]) == []  # a loop without mma is not a main loop
    assert len(sass_loops.loops(funcs["kernel_b"], min_mma=0)) == 1

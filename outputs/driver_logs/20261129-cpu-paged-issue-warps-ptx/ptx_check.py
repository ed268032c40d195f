"""The non-paged v11 kernels' PTX with PAGED_ISSUE_WARPS 4 (default) and 1: identical, instruction for instruction.
As run at tree 69c3320 (its log beside it); the test helper it calls has since changed its signature, and the test
itself (tests/masks/test_paged_prefill.py) makes the same comparison."""
import os, pathlib, sys
sys.path.insert(0, "tests/masks")
from test_paged_prefill import _v11_entries
out = pathlib.Path(os.environ.get("OUT", "."))
a = _v11_entries((), out / "w4.ptx")
b = _v11_entries(("-DLAB_FWD_MASK_PAGED_ISSUE_WARPS=1",), out / "w1.ptx")
plain = [n for n in a if n.endswith("Lb0EEEv14CUtensorMap_stS4_S4_14AttnMaskParams")]
paged = [n for n in a if n not in plain]
print(len(a), "entries;", len(plain), "plain, identical:", all(a[n] == b[n] for n in plain))
print("paged differ:", sum(a[n] != b.get(n) for n in paged), "of", len(paged))

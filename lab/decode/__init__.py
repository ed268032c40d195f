"""The decode family (kernels/decode/): lab.ops.decode's glue (op), the split plan and its CPU emulation
(splits), the paged layout in NumPy (emulate_paged) and the paged check and race of chapter n11 (paged)."""

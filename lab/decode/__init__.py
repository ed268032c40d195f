"""The decode family (kernels/decode/): lab.ops.decode's glue (op), its split plan and paged error flags (plan), the
split-K algorithm's CPU emulation (splits), the paged layout in NumPy (emulate_paged) and the paged check and race
of chapter n11 (paged)."""

"""The decode family (kernels/decode/). The product: lab.ops.decode's glue (op), its paged path and the
lab::decode_paged op (paged_op), the masked call with a window, softcap and sinks and the lab::decode_masked op
(masks), the checks and split count both paths share (checks), the split plan and paged error flags (plan), the page
flags read at a later call (deferred) and the one-crossing paths (fast). The harness: the split-K algorithm's CPU
emulation (splits), the paged layout in NumPy (emulate_paged), the masks' reference and emulation (emulate_masks),
their GPU checks and bench against plain decode (mask_checks, mask_bench), the paged check and race of chapter n11
(paged), and the ring-buffer swizzle model (swizzle_model)."""

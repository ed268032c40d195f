"""The forward family (kernels/fwd/): lab.ops.attention's glue (op), bottom-right causal on the top-left
kernels (causal) and v07's persistent work orders written out in Python (work_order)."""

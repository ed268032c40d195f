"""The wall between the product and the notebook: the modules a user's `import lab.ops` may load.

The product is what other projects call: lab.ops (attention, attention_varlen, decode, attention_fp8) and its
dispatch, the build of kernels, each family's op glue, the ring and the transformers adapter, with the few modules they need.
Everything else in lab/ is the harness that writes the book (check, bench, sweep, session, publish, record,
plot, gates, cases, profile, the NumPy emulations, findings, selftest, ...): it may import the product, never the
other way round. tests/product/test_wall.py follows every import of these modules (at module level and inside
functions) and fails, naming the chain, when one reaches a module not listed here.

Installed with `pip install .` (pyproject.toml), the product needs torch and numpy (lab.reference's float64
attention: the ring's CPU path); the harness's packages are the `notebook` extra.
"""
from __future__ import annotations

PRODUCT = frozenset({
    "lab", "lab.product",
    # lab.ops and its dispatch; the build of kernels (lab/binding.cpp, kernels/)
    "lab.ops", "lab.op_common", "lab.registry", "lab.variants", "lab.kernels", "lab.build", "lab.paths", "lab.cache_files",
    "lab.files",
    # each family's op glue and what it needs
    "lab.fwd", "lab.fwd.op", "lab.fwd.causal", "lab.fwd.head_dims", "lab.merge",
    "lab.decode", "lab.decode.op", "lab.decode.paged_op", "lab.decode.checks", "lab.decode.fast", "lab.decode.plan",
    "lab.decode.deferred", "lab.decode.masks",
    "lab.masks", "lab.masks.op", "lab.masks.fast", "lab.masks.spec", "lab.masks.backward", "lab.masks.varlen_bwd",
    "lab.masks.paged", "lab.masks.dense_route", "lab.fp8", "lab.fp8.op", "lab.fp8.backward", "lab.fp8.casts",
    "lab.fp8.kernel_bwd", "lab.fp8.quant",
    "lab.backward", "lab.backward.op", "lab.backward.node",
    # the ring and its runtime parts (on the CPU it attends with lab.reference's float64 attention)
    "lab.ring", "lab.ring.attention", "lab.ring.backward", "lab.ring.blocks", "lab.ring.comm", "lab.reference",
    # the transformers adapter
    "lab.integrations", "lab.integrations.transformers", "lab.integrations.transformers_masks",
})

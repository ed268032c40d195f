"""The attention users call: lab.ops.attention and lab.ops.decode, with SDPA's names and (B, H, S, D) layout.

Both are torch.library custom ops with fake implementations, so torch.compile traces a model that
calls them without a graph break. Bad input raises TypeError/ValueError naming the argument before
any kernel runs; nothing reaches a kernel that it cannot handle.

This module is the public face: each family's glue lives with the family (lab/fwd/op.py, lab/decode/op.py),
the kernel tables and default rules in lab.registry, the checks both ops share in lab.op_common.
"""
from __future__ import annotations

from .kernels import launcher, reload  # noqa: F401 (lab.ops.launcher / reload: the public names)
from .op_common import sm_count  # noqa: F401

# The kernel tables and the default rules live in lab.registry (no torch: gates, scripts and the publishing
# side read them too); these names stay the public ones.
from .registry import (BEST_FWD, DECODE, FWD, PAGED_DECODE, SPLIT_RULE, default_attention_version,  # noqa: F401
                       default_decode_version)
from .fwd.op import attention, attention_version, fwd_call_factory, fwd_writer  # noqa: F401
# attention_varlen: lab.masks.op's packed call, or with block_table lab.masks.paged's (window/softcap/sinks go through
# attention's arguments)
from .masks.paged import attention_varlen, check_page_errors as check_varlen_page_errors  # noqa: F401
from .decode.op import (MAX_DECODE_Q_LEN, MAX_NUM_SPLITS, decode, decode_call_factory, decode_writer,  # noqa: F401
                        raise_page_errors)
from .decode.deferred import check_page_errors  # noqa: F401 (the default paged call's flags, waited for)
from .fp8.op import attention_fp8  # noqa: F401 (the FP8 forward, fwd v13: e4m3 inputs with FA3's descales)
# attention_fp8_train: training through the FP8 forward (inputs quantised inside; gradients by the FP8 backward kernel,
# bwd v22, at D 128 on compute capability 9.0, else by the bf16 backward on dequantised copies: its backward= says)
from .fp8.backward import attention_fp8_train  # noqa: F401

# Autograd for lab::attention (and the lab::attention_backward op) is registered by lab/backward/op.py, imported
# here so that `import lab.ops` is enough for lab.ops.attention to be differentiable.
from . import backward as _backward  # noqa: E402

_backward.register()

"""The backward family (kernels/bwd/): autograd for lab.ops.attention and the backward custom op (op), its check
and bench adapters and the training example (harness), the race against SDPA and FlexAttention (race), and FlashAttention-2's backward in NumPy (emulate).

lab.ops imports this package and calls register(), so lab.ops.attention is differentiable without anyone
importing it; the harness is not imported here, so lab.ops never pulls in the bench side.
"""
from .op import (BEST_BWD, BEST_BWD_HOPPER, BWD, DETERMINISTIC_BWD, _bwd_impl, backward_version,  # noqa: F401
                 register)  # (_bwd_impl: timed bare by n10)

"""The eager gradient call of lab.ops.attention as one C++ autograd node (lab/binding.cpp's AttentionNode).

Why: a cold training step (an L2 flush, then forward and backward) shows the host's work before the first
launch, and the Python route (the checks, then lab.backward.op.EagerAttention, a Python autograd.Function)
costs ~55 us more per forward and ~10 us more per backward than the node (CPU box). The node runs the same
kernels as that route: its forward is attn_call's, its backward attn_bwd_call's with the kernel
lab.backward.op.backward_version picks, so the gradients are bit-identical (tests/bwd/test_grad_node_gpu.py).

The plan binds the forward and the non-deterministic backward launchers for one (S_q, D, causal, device); the
node reads torch.are_deterministic_algorithms_enabled() when its backward runs, as lab.backward.op does, and
then asks deterministic_launcher (set once in the binding) for the deterministic kernel. Head dims without a
deterministic backward (above 128) keep the Python route, which refuses them in deterministic mode up front.
"""
from __future__ import annotations

import functools

import torch

from .. import build
from ..kernels import launcher
from ..op_common import _capability
from ..registry import BWD, DETERMINISTIC_BWD, FWD
from .op import backward_version

# Head dims the node takes: those the deterministic backward has a kernel for, so its backward never refuses a mode.
NODE_HEAD_DIMS = BWD[DETERMINISTIC_BWD[0]].head_dims


def deterministic_launcher(head_dim: int) -> int:
    """The deterministic backward's launcher for this head dim on the current device (the autograd engine runs a
    node's backward with its device current), built on first use: the node's resolver."""
    capability = _capability(torch.device("cuda")) if torch.cuda.is_available() else ()
    return launcher(BWD, backward_version(head_dim, capability=capability, deterministic=True))


@functools.lru_cache(maxsize=None)
def _resolver_set(module) -> bool:
    module.set_deterministic_resolver(deterministic_launcher)
    return True


def grad_plan(query, is_causal: bool, forward_version):
    """attn_auto_grad bound to this query's forward and backward launchers, or None (the Python route then).

    forward_version(query, None, is_causal) names the forward kernel (lab.fwd.op.attention_version: passed in,
    since lab.backward imports nothing of the forward)."""
    d = query.shape[-1]
    if query.get_device() < 0 or d not in NODE_HEAD_DIMS:
        return None
    try:
        forward = forward_version(query, None, is_causal)
        backward = backward_version(d, capability=_capability(query.device))
    except ValueError:
        return None
    module = build.binding().module
    _resolver_set(module)
    return functools.partial(module.attn_auto_grad, launcher(FWD, forward), launcher(BWD, backward))

"""lab.ops.attention: the forward pass with SDPA's names and (B, H, S, D) layout, as a torch.library custom op.

The eager default call reaches the kernel in one crossing of the binding (a plan memoised per shape and
device); every other call checks its input here (lab.op_common's checks) and picks the kernel by lab.registry's
default rules. Bottom-right causal runs on the top-left kernels (lab.fwd.causal).
"""
from __future__ import annotations

import functools

import torch

from .. import build
from ..kernels import keep_plan, launcher, resolve_version
from ..kernels import plans as _plans
from ..op_common import _check_cuda, _check_heads, _check_qkv, _check_qkv_own_dv, _direct, _eager, _scale
from ..backward.node import grad_plan
from ..backward.op import EagerAttention
from ..masks.op import attention_masked
from ..masks.spec import check_bools
from ..registry import BEST_FWD, FAST_HEAD_DIMS, FWD, FWD_HEAD_DIMS, NARROW_FWD
from . import causal, head_dims
from .head_dims import attention_version  # noqa: F401 (the kernel choice, where lab.masks can import it too)

_Tensor = torch.Tensor  # the exact type the fast path takes (a subclass goes through the dispatcher)


def _attention_impl(query, key, value, is_causal: bool, scale: float, version: str, want_lse: bool = True):
    # The binding allocates out (and lse): Python-side allocations cost ~2.7 us each on the host path. It
    # also copies any input the kernels cannot read as it is (misaligned, strides not multiples of 8
    # elements, an expanded dim): the result is right, only slower.
    out, lse = build.binding().attn_call(launcher(FWD, version), query, key, value, scale, is_causal, want_lse)
    return out, lse


@torch.library.custom_op("lab::attention", mutates_args=())
def _attention_op(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, is_causal: bool, scale: float,
                  version: str) -> tuple[torch.Tensor, torch.Tensor]:
    return _attention_impl(query, key, value, is_causal, scale, version)


@_attention_op.register_fake
def _(query, key, value, is_causal, scale, version):
    return query.new_empty(query.shape), query.new_empty(query.shape[:3], dtype=torch.float32)


def attention(query, key, value, is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False,
              version=None, return_lse: bool = False, causal_variant: str = "upper_left", window_size=None,
              softcap: float = 0.0, sinks=None):
    """Scaled dot-product attention, (B, H, S, D) like F.scaled_dot_product_attention.

    is_causal follows SDPA (top-left aligned: query i sees keys j <= i, also when S_q != S_k).
    causal_variant: "upper_left" (SDPA's alignment, the default) or "lower_right" (FlashAttention's: query i
    sees keys j <= i + S_k - S_q; rows that see no key give 0), the names of torch.nn.attention.bias.
    CausalVariant; lab.fwd.causal says how lower_right runs on the top-left kernels.
    version: None picks the fastest kernel for the head dim; or 1/"v01", 2/"v02".
    Head dims: D_qk and D_v (value's, which may differ from query's, as in SDPA) up to 256; with version=None
    a D without a kernel of its own runs on the next one's (64, 128, 192, 256), zero-padded (lab.fwd.head_dims
    says why that is exact); on compute capability 9.0 a D_qk = D_v that is a multiple of 8 runs on the next
    width's kernel unpadded when no gradient is wanted (lab.fwd.head_dims.narrow). Above 128: the forward on
    compute capability 9.0, the backward by bwd v09 (no deterministic mode: under
    torch.use_deterministic_algorithms a gradient raises NotImplementedError).
    return_lse: also return the natural-log log-sum-exp per row, float32 (B, H, S_q).
    window_size=(left, right) (-1: unbounded; combines with causal), softcap (0: off), sinks ((H_q,) float32
    logits that join the softmax and attend to nothing): FlashAttention's names, run by lab.masks.op (the rule
    is written out in lab.masks.spec; the window is aligned with the causal diagonal of causal_variant).
    """
    if window_size is not None or softcap or sinks is not None:
        return attention_masked(query, key, value, is_causal, scale, enable_gqa, version, return_lse, causal_variant,
                                window_size, softcap, sinks)
    if _eager() and version is None and causal_variant == "upper_left" and type(is_causal) is bool and \
            type(enable_gqa) is bool and type(return_lse) is bool and (scale is None or type(scale) is float) and \
            type(query) is _Tensor and type(key) is _Tensor and type(value) is _Tensor:
        # the eager default call (torch.compile traces the full path below); a flag of another type takes the full
        # path, which refuses it (the binding's bool would take 1 as True)
        answer = _attention_fast(query, key, value, is_causal, scale, enable_gqa, return_lse)
        if answer is not None:
            return answer
    if isinstance(query, torch.Tensor) and isinstance(value, torch.Tensor) and query.dim() == 4 and \
            value.dim() == 4 and max(query.shape[-1], value.shape[-1]) > FAST_HEAD_DIMS[-1]:
        head_dims.refuse_gradients(query, key, value)  # deterministic mode above 128: say so before any padding
    # Every argument is checked before the device, so a call on CPU tensors names its bad argument first.
    check_bools(is_causal=is_causal, enable_gqa=enable_gqa, return_lse=return_lse)
    if causal_variant not in causal.VARIANTS:
        raise ValueError(f"causal_variant must be one of {causal.VARIANTS}, got {causal_variant!r}")
    pad = version is None and head_dims.needs_padding(query, value) and not _narrow(query, key, value, is_causal)
    if pad:  # value may have its own head dim; both are padded to a kernel's
        _check_qkv_own_dv(query, key, value)
    else:
        _check_qkv(query, key, value, "key", "value")
    _check_heads(query, key, enable_gqa)
    if key.shape[2] == 0:
        raise ValueError("key has sequence length 0: every query row would attend to nothing")
    scale = _scale(scale, query.shape[-1])
    if pad:
        width = head_dims.kernel_head_dim(query.shape[-1], value.shape[-1])  # names a head dim past the widest
    elif version is not None:
        resolve_version(version, FWD, query.shape[-1], BEST_FWD)  # an unknown name, or a head dim it lacks
    _check_cuda(query)
    if pad:
        def attend(q, k, v, padded_scale):
            return attention(q, k, v, is_causal, padded_scale, enable_gqa, None, True, causal_variant)
        out, lse = head_dims.padded(attend, query, key, value, scale, width)
        return (out, lse) if return_lse else out
    if is_causal and causal_variant == "lower_right" and key.shape[2] != query.shape[2]:
        def attend(q, k, v, top_left_causal):
            return attention(q, k, v, top_left_causal, scale, enable_gqa, version, return_lse=True)
        out, lse = causal.lower_right(attend, query, key, value)
        return (out, lse) if return_lse else out
    name = attention_version(query, version, is_causal)
    if _direct(query, key, value):  # eager: no dispatcher, and no LSE buffer unless asked for
        out, lse = _attention_impl(query, key, value, is_causal, scale, name, return_lse)
    elif _eager() and all(type(t) is _Tensor for t in (query, key, value)):  # eager with gradients
        out, lse = EagerAttention.apply(query, key, value, is_causal, scale, name, _attention_impl)
    else:
        out, lse = _attention_op(query, key, value, is_causal, scale, name)
    return (out, lse) if return_lse else out


def _narrow(query, key, value, is_causal) -> bool:
    """The default kernel of a CUDA query reads its head dim unpadded (lab.fwd.head_dims.narrow). Called once
    head_dims.needs_padding has seen four 4-D tensors."""
    if query.device.type != "cuda" or not head_dims.narrow_dim(query.shape[-1]):
        return False
    try:
        return head_dims.narrow(query, key, value, attention_version(query, None, is_causal))
    except ValueError:
        return False


def _attention_fast(query, key, value, is_causal: bool, scale, enable_gqa: bool, return_lse: bool):
    """The eager default call in one crossing into the binding (attn_auto), or None: then attention() takes
    its full path, which raises the right error for whatever was refused.

    Why: in a cold timing (an L2 flush, then one call) the host time of the public op is not hidden, and
    on the H200 the checks, the kernel choice and the Python layers cost ~8-17 us over the binding call
    (outputs/driver_logs/20261123-h200-public-op-gap-*.json). Here the kernel comes from a plan memoised
    on (S_q, D, causal, device) and every check runs in C++ (binding.cpp's python_rules_hold, check_call).
    """
    shape = query.shape
    if len(shape) != 4:
        return None
    grad = torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad)
    plan_key = (shape[2], shape[3], is_causal, query.get_device(), grad)
    plan = _plans.get(plan_key)
    if plan is None:
        plan = grad_plan(query, is_causal, attention_version) if grad else _fwd_plan(query, is_causal)
        if plan is None:
            return None
        keep_plan(plan_key, plan)
    if grad:  # a C++ autograd node (lab.backward.node): always returns lse, which it saves
        error, out, lse = plan(query, key, value, is_causal, enable_gqa, scale)
    else:
        error, out, lse = plan(query, key, value, is_causal, enable_gqa, return_lse, scale)
    if error:
        return None
    return (out, lse) if return_lse else out


def _fwd_plan(query, is_causal: bool):
    """attn_auto bound to the default kernel's launcher for this query, or None (not a CUDA tensor, or no
    kernel for its head dim: the full path says which)."""
    d = query.shape[-1]
    if query.get_device() < 0 or (d not in FWD_HEAD_DIMS and not head_dims.narrow_dim(d)):  # the rest run padded
        return None
    try:
        name = attention_version(query, None, is_causal)
    except ValueError:
        return None
    if d not in FWD_HEAD_DIMS and name not in NARROW_FWD:  # a narrow D whose default kernel pads (not Hopper)
        return None
    return functools.partial(build.binding().module.attn_auto, launcher(FWD, name))


def fwd_writer(version: str, defines=None):
    """For lab.check: run(q, k, v, is_causal, scale, out) writes into the caller's (poisoned) `out`."""
    def run(q, k, v, is_causal, scale, out, debug=None):
        address = launcher(FWD, version, defines)
        build.binding().attn_fwd(address, q, k, v, out, None, _scale(scale, q.shape[-1]), is_causal, debug)
    return run


def fwd_call_factory(version: str, defines=None):
    """For lab.sweep: make(q, k, v, is_causal) -> a zero-argument call with everything resolved up front."""
    def make(q, k, v, is_causal):
        address, bind = launcher(FWD, version, defines), build.binding()
        out, scale = torch.empty_like(q), _scale(None, q.shape[-1])
        return lambda: bind.attn_fwd(address, q, k, v, out, None, scale, is_causal, None)
    return make

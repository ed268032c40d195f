"""What every public op (lab.ops.attention, lab.ops.decode) does first: the device facts it reads once, the
test for the eager fast path, the input checks in Python's exception types, and the softmax scale.

Shared by the families' op glue (lab.fwd.op, lab.decode.op), so each family checks its input the same way.
"""
from __future__ import annotations

import ctypes
import math

import torch

FLOAT32_MAX = 3.4028234663852886e38
_devices: dict = {}


def _device(device) -> tuple[tuple, int]:
    """(compute capability, multiprocessor count) of a CUDA device, read once per device index: both are on
    every call's path (kernel choice, split plan), and get_device_properties costs microseconds."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    info = _devices.get(index)
    if info is None:
        if not torch.cuda.is_available():  # fake CUDA tensors on a CPU-only torch (tracing tests): no GPU to ask
            return (0, 0), 0
        props = torch.cuda.get_device_properties(index)
        info = _devices[index] = ((props.major, props.minor), props.multi_processor_count)
    return info


def sm_count(device) -> int:
    return _device(device)[1]


_autograd: set[str] = set()


def register_autograd_once(op: str, backward, setup_context) -> None:
    """torch.library.register_autograd for the custom op `op`, once per process: each family's op module calls it
    whenever it defines the op, and torch refuses a second registration."""
    if op not in _autograd:
        torch.library.register_autograd(op, backward, setup_context=setup_context)
        _autograd.add(op)


def _capability(device) -> tuple:
    return _device(device)[0]


def _eager() -> bool:
    """No tracing mode of any kind: not torch.compile (asked first: dynamo folds it, and never sees the
    two C calls after it), no dispatch mode (fake tensors), no torch function mode."""
    return not (torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack() or
                torch._C._is_torch_function_mode_enabled())


def _direct(*tensors) -> bool:
    """True when a call can skip the torch.library dispatcher and run the implementation directly.

    The custom op is what torch.compile, export and fake-tensor tracing see, and what raises when a
    gradient is asked for; in plain eager mode its dispatch costs ~8 us of Python per call (measured on
    the CPU box), more than SDPA's whole host path allows us (lab.hostcost's target: <= SDPA's host cost + 5 us). So:
    plain tensors, no tracing mode of any kind, no gradient wanted -> call the same implementation
    function the op registers.
    """
    if not _eager():
        return False
    grad = torch.is_grad_enabled()
    for t in tensors:
        if type(t) is not torch.Tensor or (grad and t.requires_grad):
            return False
    return True


# ------------------------------------------------------------------ validation

_DTYPES = (torch.float16, torch.bfloat16)


PAGED_LAYOUT = "(num_pages, page_size, H_kv, D) with a block_table"


def _check_tensor(t, name: str, like=None, layout: str = "(B, H, S, D)", same_head_dim: bool = True,
                  cuda: bool = True):
    # Every attribute is read once: this runs three times per call, on the host path lab.hostcost bounds.
    # layout=PAGED_LAYOUT: a paged cache, whose first dimension is pages, not the batch. same_head_dim=False: a
    # value whose head dim may differ from the query's (SDPA allows it). cuda=False: the caller checks the device
    # itself (_check_cuda) after every shape check, so a bad shape on a CPU tensor names the shape first.
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    dtype, shape, device = t.dtype, t.shape, t.device
    if dtype not in _DTYPES:
        raise TypeError(f"{name}.dtype must be torch.float16 or torch.bfloat16, got {dtype}")
    if len(shape) != 4:
        raise ValueError(f"{name} must be 4-D {layout}, got shape {tuple(shape)}")
    if cuda and device.type != "cuda":
        _check_cuda(t, name)
    if like is not None:
        if dtype != like.dtype:
            raise TypeError(f"{name}.dtype ({dtype}) must match query.dtype ({like.dtype})")
        if device != like.device:
            raise ValueError(f"{name} is on {device} but query is on {like.device}")
        like_shape = like.shape
        if shape[0] != like_shape[0] and layout != PAGED_LAYOUT:
            raise ValueError(f"{name} has batch {shape[0]} but query has batch {like_shape[0]}")
        if same_head_dim and shape[3] != like_shape[3]:
            raise ValueError(f"{name} has head dim {shape[3]} but query has {like_shape[3]}")
    if t.stride(3) != 1 and t.numel():
        raise ValueError(f"{name} must have a contiguous last dimension, got stride(-1) = {t.stride(-1)}; "
                         f"call {name}.contiguous()")


def _check_cuda(t, name: str = "query"):
    """The device check, made after the argument checks: key and value were compared with query's device
    already, so one call on query covers all three."""
    if t.device.type != "cuda":
        raise ValueError(f"{name} must be on a CUDA device, got {t.device} (CPU mode: use lab.emulate)")


def _check_qkv(query, key, value, kname: str, vname: str):
    """The checks every op makes first (the binding's check_call, in Python's exception types), except the
    device: each op calls _check_cuda(query) after its own shape checks."""
    _check_tensor(query, "query", cuda=False)
    _check_tensor(key, kname, query, cuda=False)
    _check_tensor(value, vname, query, cuda=False)
    if key.shape != value.shape:
        raise ValueError(f"{kname} and {vname} shapes differ: {tuple(key.shape)} vs {tuple(value.shape)}")


def _check_qkv_own_dv(query, key, value, agree: str = "(B, H, S)", shown=None):
    """_check_qkv where value may have its own head dim (SDPA allows it): key and value agree in every dim but the
    last, and both head dims are at least 1. shown: the shapes the error names, where the caller checks views."""
    _check_tensor(query, "query", cuda=False)
    _check_tensor(key, "key", query, cuda=False)
    _check_tensor(value, "value", query, same_head_dim=False, cuda=False)
    if key.shape[:3] != value.shape[:3]:
        k_shape, v_shape = shown or (key.shape[:3], value.shape[:3])
        raise ValueError(f"key and value must agree in {agree}: {tuple(k_shape)} vs {tuple(v_shape)}")
    if query.shape[-1] == 0 or value.shape[-1] == 0:
        raise ValueError(f"head dims must be >= 1, got query/key {query.shape[-1]}, value {value.shape[-1]}")


def _check_heads(query, key, enable_gqa: bool, what: str = "key"):
    Hq, Hkv = query.shape[1], key.shape[1]
    if Hq != Hkv and not enable_gqa:
        raise ValueError(f"query has {Hq} heads but {what} has {Hkv}: pass enable_gqa=True (as in SDPA) for GQA/MQA")
    if Hkv == 0 or Hq % Hkv:
        raise ValueError(f"query heads ({Hq}) must be a multiple of {what} heads ({Hkv})")


def _readable(t):
    """The kernels' preconditions (16-byte aligned rows, strides in multiples of 8 elements), by a copy if not."""
    if t.data_ptr() % 16:  # contiguous() would hand back the same misaligned storage
        return t.clone(memory_format=torch.contiguous_format)
    if any(s % 8 for s in t.stride()[:-1]) or t.stride(-1) != 1:
        return t.contiguous()
    return t


def _scale(scale, head_dim: int) -> float:
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise TypeError(f"scale must be a finite float or None, got {scale!r}")
    if abs(scale) > FLOAT32_MAX:  # the kernels take it as a float32: it would become +-inf
        raise ValueError(f"scale={scale!r} overflows float32 (|scale| must be <= {FLOAT32_MAX:.4g})")
    return float(scale)



def run_packed_launcher(call, params: bytes, device, what: str) -> None:
    """Call a launcher that takes packed params (lab.masks' structs, through ctypes) on `device`'s current stream;
    a nonzero status raises RuntimeError naming `what`. On the current device no device context is entered (it
    costs a few us of host time a call)."""
    stream = ctypes.c_void_p(torch.cuda.current_stream(device).cuda_stream)
    if device.index == torch.cuda.current_device():
        rc = call(params, stream)
    else:
        with torch.cuda.device(device):
            rc = call(params, stream)
    if rc != 0:
        raise RuntimeError(f"{what} failed with code {rc} (LAB_E_* < 0, or a cudaError_t)")


def varlen_outputs(q, want_lse: bool, rows_q):
    """A packed call's O (total_q, H_q, D) and LSE (H_q, total_q) or None, with the rows of no sequence (rows_q:
    on, when the host knows rows_q) set to zeros and -inf; the kernel writes every other row."""
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty((q.shape[1], q.shape[0]), dtype=torch.float32, device=q.device) if want_lse else None
    if rows_q is not None and rows_q < q.shape[0]:
        out[rows_q:].zero_()
        if lse is not None:
            lse[:, rows_q:].fill_(float("-inf"))
    return out, lse


def _dense(t: torch.Tensor) -> bool:
    """Whether t's elements fill its memory exactly once (a permutation of a contiguous layout; size-1 dims free)."""
    expected = 1
    for size, stride in sorted(((n, st) for n, st in zip(t.shape, t.stride()) if n > 1), key=lambda d: d[1]):
        if stride != expected:
            return False
        expected *= size
    return True


def grad_like(t: torch.Tensor) -> torch.Tensor:
    """A gradient for t: t's strides where the kernels write through them (a dense 4-D tensor, last stride 1, the
    others multiples of 8), else contiguous. The binding's grad_like (lab/binding.cpp) is the same rule; the backward
    ops' fakes use this one, so torch.compile sees the layout the kernels give."""
    st = t.stride()
    ok = t.numel() > 0 and t.dim() == 4 and _dense(t) and (t.shape[3] <= 1 or st[3] == 1) \
        and all(t.shape[i] <= 1 or st[i] % 8 == 0 for i in range(3))
    return torch.empty_like(t, memory_format=torch.preserve_format) if ok else t.new_empty(t.shape)

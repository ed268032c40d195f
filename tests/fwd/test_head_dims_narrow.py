"""Narrow head dims on the CPU: which calls fwd v05 / v07 run unpadded (lab.fwd.head_dims.narrow, lab.fwd.op's
routing) and that the Python rule is the launcher's own (narrow_head_dim in common/hopper/attn_fwd_sm90.cuh,
compiled here with nvcc). What the kernels then compute is checked on the GPU (lab.fwd.head_dims_gpu.checks),
their column stores in tests/fwd/test_epilogue_quad.py."""
import shutil
import subprocess
from types import SimpleNamespace

import pytest
import torch

from lab import paths
from lab.fwd import head_dims
from lab.fwd import op as fwd_op
from lab.registry import narrow_backward_dim


def test_narrow_dims():
    assert [d for d in range(0, 300) if head_dims.narrow_dim(d)] == \
        [d for d in range(8, 256, 8) if d not in (64, 128, 192)]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_the_rule_and_the_width_are_the_launchers(tmp_path):
    src = tmp_path / "narrow.cu"
    src.write_text('#include <cstdio>\n#include "common/hopper/attn_fwd_sm90.cuh"\n'
                   'int main() { for (int d = 0; d < 300; ++d) std::printf("%d ", lab::sm90::narrow_head_dim(d) ? '
                   'lab::sm90::narrow_width(d) : 0); }\n')
    exe = tmp_path / "narrow"
    subprocess.run(["nvcc", "-std=c++17", "-arch=sm_90a", "-I", str(paths.KERNELS), str(src), "-o", str(exe)],
                   check=True, capture_output=True)
    launcher = [int(w) for w in subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split()]
    assert launcher == [head_dims.kernel_head_dim(d, d) if head_dims.narrow_dim(d) else 0 for d in range(300)]
    # bwd v20's entry takes the narrow dims whose width is at most 128: lab.registry's narrow_backward_dim
    assert [d for d in range(300) if 0 < launcher[d] <= 128] == [d for d in range(300) if narrow_backward_dim(d)]


def test_narrow_needs_a_narrow_version_one_head_dim_and_no_gradient():
    q, v64 = torch.zeros(1, 2, 5, 80), torch.zeros(1, 2, 5, 64)
    assert head_dims.narrow(q, q, q, "v07") and head_dims.narrow(q, q, q, "v05")
    assert not head_dims.narrow(q, q, q, "v04")  # mma.sync: padded
    assert not head_dims.narrow(q, q, v64, "v07")  # D_v != D_qk: padded
    for d in (64, 100, 128, 192, 256, 264):
        t = torch.zeros(1, 2, 5, d)
        assert not head_dims.narrow(t, t, t, "v07")
    wide = torch.zeros(1, 2, 5, 200)
    assert head_dims.narrow(wide, wide, wide, "v10")
    wants_grad = q.clone().requires_grad_(True)
    assert head_dims.narrow(wants_grad, q, q, "v07")  # bwd v20 reads and writes D = 80 unpadded
    wide_grad = wide.clone().requires_grad_(True)
    assert not head_dims.narrow(wide_grad, wide, wide, "v10")  # no narrow backward above 128: padded
    with torch.no_grad():
        assert head_dims.narrow(wide_grad, wide, wide, "v10")
    with _deterministic():
        assert not head_dims.narrow(wants_grad, q, q, "v07")  # v20 has no fixed dQ order: the padded call's v18
        with torch.no_grad():
            assert head_dims.narrow(wants_grad, q, q, "v07")


class _deterministic:
    def __enter__(self):
        self.was = torch.are_deterministic_algorithms_enabled()
        torch.use_deterministic_algorithms(True)

    def __exit__(self, *exc):
        torch.use_deterministic_algorithms(self.was)


def _cuda(seqlen: int, head_dim: int):
    return SimpleNamespace(shape=(1, 4, seqlen, head_dim), device=SimpleNamespace(type="cuda", index=0))


@pytest.mark.parametrize("capability,head_dim,d_v,seqlen,causal,narrow", [
    ((9, 0), 80, 80, 8192, False, True),   # v07 at width 128
    ((9, 0), 96, 96, 512, True, True),
    ((9, 0), 32, 32, 512, False, True),    # v05 at width 64
    ((9, 0), 32, 32, 8192, True, True),    # v07 at width 64
    ((9, 0), 80, 64, 8192, False, False),  # D_v != D_qk
    ((9, 0), 100, 100, 8192, False, False),
    ((9, 0), 200, 200, 2048, False, True),   # v10 at width 256
    ((9, 0), 160, 160, 512, True, True),     # v10 at width 192
    ((9, 0), 200, 160, 2048, False, False),
    ((8, 0), 80, 80, 8192, False, False),  # v04 pads
    ((8, 0), 200, 200, 2048, False, False),  # no wide forward off Hopper: the full path raises
    ((10, 0), 32, 32, 512, False, False)])
def test_the_public_op_routes_narrow_calls_by_gpu(monkeypatch, capability, head_dim, d_v, seqlen, causal, narrow):
    monkeypatch.setattr(head_dims, "_capability", lambda device: capability)  # where the choice reads it
    q, v = _cuda(seqlen, head_dim), _cuda(seqlen, d_v)
    assert fwd_op._narrow(q, q, v, causal) is narrow


@pytest.mark.parametrize("shape,dtype,pitch", [((2, 3, 5, 200), torch.bfloat16, 256), ((1, 2, 7, 80), torch.float16, 128),
                                               ((1, 2, 9, 136), torch.bfloat16, 192), ((1, 2, 7, 96), torch.float16, 128)])
def test_aligned_rows_copies_to_rows_on_128_byte_lines(shape, dtype, pitch):
    t = torch.randn(*shape).to(dtype)
    a = head_dims.aligned_rows(t)
    assert a.shape == t.shape and torch.equal(a, t) and a.stride(-2) == pitch and a.stride(-1) == 1
    assert (a.stride(-2) * a.element_size()) % 128 == 0 and a.data_ptr() != t.data_ptr()
    bshd = torch.randn(shape[0], shape[2], shape[1], shape[3]).to(dtype).transpose(1, 2)  # head offsets off lines too
    assert torch.equal(head_dims.aligned_rows(bshd), bshd) and head_dims.aligned_rows(bshd).stride(-2) == pitch


def test_aligned_rows_leaves_aligned_tensors_alone():
    for d in (64, 128, 256):
        t = torch.randn(1, 2, 5, d).to(torch.bfloat16)
        assert head_dims.aligned_rows(t) is t
    off = torch.randn(1, 2, 5, 136).to(torch.bfloat16)[..., :128]  # 272-byte rows: not aligned, though D = 128
    assert head_dims.aligned_rows(off) is not off and head_dims.aligned_rows(off).stride(-2) == 128


def test_the_line_model_gives_the_profiled_ratio_and_aligned_rows_remove_it():
    native = {w: head_dims.lines_per_row(w, w) for w in (64, 128, 192, 256)}
    assert native == {64: 1, 128: 2, 192: 3, 256: 4}  # 128-byte rows of a box each start a line
    ratio = {d: head_dims.lines_per_row(d, w) / native[w] for d, w in ((32, 64), (80, 128), (96, 128), (160, 192),
                                                                        (200, 256))}
    assert ratio == {32: 1.0, 80: 1.375, 96: 1.25, 160: 4 / 3, 200: 6.625 / 4}
    for d, w in ((80, 128), (96, 128), (160, 192), (200, 256)):  # the pitch aligned_rows gives: no extra line
        pitch = head_dims.aligned_rows(torch.zeros(1, 1, 2, d, dtype=torch.bfloat16)).stride(-2) * 2
        assert head_dims.lines_per_row(d, w, pitch=pitch) == -(-d // 64)

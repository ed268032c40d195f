"""cuDNN's FP8 attention forward as a peer: a `cudnn.pygraph` with one `sdpa_fp8` node, run on torch tensors.

The graph (nvidia-cudnn-frontend 1.32's Python graph API; the node's arguments are its C++ binding's):

    Q, K, V       e4m3, (B, H, S, D) as stored (any strides torch gives; GQA when H_kv divides H_q)
    descale_q/k/v float32 1x1x1x1: one per tensor (x ~= x_fp8 * descale, lab.fp8.quant's convention)
    descale_s     1 / scale_s;  scale_s = 448: P in [0, 1] is stored as e4m3(P * 448) before P V
    scale_o       1 / descale_o: O is written as e4m3(O * scale_o); descale_o defaults to V's descale
    O             e4m3, (B, H, S, D_v);  Amax_O float32 1x1x1x1 (amax_s stays virtual, as the frontend asks)

On Hopper the FP8 forward writes e4m3 only (a bf16 O needs Blackwell and cuDNN >= 9.13), so `FP8Attention.output()`
returns O dequantised. Every `cudnn` import sits inside a function: the lab imports without the peer, and
`require()` names how to install it when it is missing.
"""
from __future__ import annotations

import math

import torch

from . import quant

SCALE_S = 448.0  # the frontend's recommended scale_s for E4M3 without dropout (Amax S is deprecated)
INSTALL = ("cuDNN's FP8 peer needs the `cudnn` module of nvidia-cudnn-frontend (1.32) and apache-tvm-ffi, for "
           "CPython 3.12 on x86-64. On the GPU machine: copy shared/device/peers/*.whl into .peers/ of the "
           "checkout (ignored), carry it, and run  python3 -m pip install -q --no-index --no-deps --no-compile "
           "--target /tmp/peers .peers/*.whl && export PYTHONPATH=/tmp/peers:$PYTHONPATH  (shared/device/README.md, "
           "'The cuDNN FP8 peer'); elsewhere: pip install nvidia-cudnn-frontend")


def require():
    """The `cudnn` module, or an ImportError that says how to install it."""
    try:
        import cudnn
    except ImportError as err:  # OSError from a missing libcudnn is not caught: that is another fault
        raise ImportError(f"{INSTALL}. ({type(err).__name__}: {err})") from err
    return cudnn


def unavailable() -> str | None:
    """Why the peer cannot run here (no GPU, or no `cudnn`), or None when it can."""
    if not torch.cuda.is_available():
        return "no GPU"
    try:
        require()
    except ImportError as err:
        return str(err)
    return None


def _scalar(value: float) -> torch.Tensor:
    return torch.full((1, 1, 1, 1), float(value), dtype=torch.float32, device="cuda")


class FP8Attention:
    """One built sdpa_fp8 graph bound to its inputs: `call()` runs it (what the race times), `output()`
    reads O back dequantised. Build once per shape; the inputs' storage may be refilled between calls."""

    def __init__(self, q: quant.Quantized, k: quant.Quantized, v: quant.Quantized, is_causal: bool = False,
                 scale: float | None = None, descale_o: float | None = None):
        cudnn = require()
        for name, x in (("q", q), ("k", k), ("v", v)):
            if x.format != "e4m3" or x.data.dtype != torch.float8_e4m3fn or not x.data.is_cuda:
                raise ValueError(f"{name}: sdpa_fp8 here takes e4m3 CUDA tensors, got {x.format} {x.data.dtype} "
                                 f"on {x.data.device}")
        B, Hq, Sq, D = q.data.shape
        if k.data.shape[0] != B or Hq % k.data.shape[1] or v.data.shape[:3] != k.data.shape[:3]:
            shapes = " ".join(f"{n}{tuple(x.data.shape)}" for n, x in (("q", q), ("k", k), ("v", v)))
            raise ValueError(f"incompatible shapes {shapes}")
        self.scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
        self.descale_o = v.scalar_descale() if descale_o is None else float(descale_o)
        self.inputs = (q, k, v)
        self.o = torch.empty(B, Hq, Sq, v.data.shape[-1], dtype=torch.float8_e4m3fn, device="cuda")
        self.amax_o = torch.zeros(1, 1, 1, 1, dtype=torch.float32, device="cuda")
        scalars = {"descale_q": q.scalar_descale(), "descale_k": k.scalar_descale(), "descale_v": v.scalar_descale(),
                   "descale_s": 1.0 / SCALE_S, "scale_s": SCALE_S, "scale_o": 1.0 / self.descale_o}
        self._scalars = {name: _scalar(value) for name, value in scalars.items()}
        self.handle = cudnn.create_handle()
        try:
            cudnn.set_stream(self.handle, torch.cuda.current_stream().cuda_stream)
            self.graph = self._build(cudnn, is_causal)
            self.workspace = torch.empty(max(self.graph.get_workspace_size(), 1), dtype=torch.uint8, device="cuda")
        except BaseException:
            self.close()  # a graph the frontend declines leaves no handle behind
            raise

    def _build(self, cudnn, is_causal: bool):
        fp8, fp32 = cudnn.data_type.FP8_E4M3, cudnn.data_type.FLOAT
        graph = cudnn.pygraph(io_data_type=fp8, intermediate_data_type=fp32, compute_data_type=fp32, handle=self.handle)
        q, k, v = (graph.tensor(dim=list(x.data.shape), stride=list(x.data.stride()), data_type=fp8, name=name)
                   for name, x in zip("QKV", self.inputs))
        ports = {name: graph.tensor(dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=fp32, name=name)
                 for name in self._scalars}
        o, _stats, _amax_s, amax_o = graph.sdpa_fp8(q=q, k=k, v=v, **ports, generate_stats=False, name="sdpa_fp8",
                                                    attn_scale=self.scale, use_causal_mask=bool(is_causal))
        o.set_output(True).set_dim(list(self.o.shape)).set_stride(list(self.o.stride())).set_data_type(fp8)
        amax_o.set_output(True).set_dim([1, 1, 1, 1]).set_stride([1, 1, 1, 1]).set_data_type(fp32)
        build_plans(cudnn, graph)
        self._pack = {q: self.inputs[0].data, k: self.inputs[1].data, v: self.inputs[2].data, o: self.o,
                      amax_o: self.amax_o, **{ports[name]: t for name, t in self._scalars.items()}}
        return graph

    def call(self) -> torch.Tensor:
        """Run the graph once on the current stream; returns O (e4m3, written in place)."""
        self.graph.execute(self._pack, self.workspace, handle=self.handle)
        return self.o

    def output(self) -> torch.Tensor:
        """O as float32: o_fp8 * descale_o."""
        return self.o.float() * self.descale_o

    def close(self) -> None:
        """Release the handle (the graph and buffers go with the object)."""
        if self.handle is not None:
            require().destroy_handle(self.handle)
            self.handle = None


def build_plans(cudnn, graph) -> None:
    """The graph API's steps from a described graph to a runnable one: validate, lower, plan (heuristic A, then the
    fallback), check support, build. Raises where the frontend declines the graph."""
    graph.validate()
    graph.build_operation_graph()
    graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    graph.check_support()
    graph.build_plans()


def sdpa_fp8(q: quant.Quantized, k: quant.Quantized, v: quant.Quantized, is_causal: bool = False,
             scale: float | None = None) -> torch.Tensor:
    """One call, built and run: cuDNN's FP8 forward of the quantised inputs, O dequantised to float32."""
    attention = FP8Attention(q, k, v, is_causal, scale)
    try:
        attention.call()
        torch.cuda.synchronize()
        return attention.output()
    finally:
        attention.close()

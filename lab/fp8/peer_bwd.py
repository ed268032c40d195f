"""cuDNN's FP8 attention backward as a peer: `cudnn.pygraph`'s sdpa_fp8 (with stats) and sdpa_fp8_backward.

The graphs (nvidia-cudnn-frontend 1.32's Python API, as its own samples build them):

    forward   Q, K, V e4m3 -> O e4m3 (scale_o = 1 / V's descale), Stats float32 (B, H, S, 1), Amax_S, Amax_O
    backward  Q, K, V, O, dO e4m3, Stats; descales q, k, v, o, dO, s = 1/448, dP; scales s = 448, dP, dQ, dK, dV
              -> dQ, dK, dV e4m3 and their amaxes, Amax_dP

cuDNN's FP8 backward writes e4m3 gradients with the caller's scales (delayed scaling, as Transformer Engine
runs it). `FP8Backward` runs it once with unit scales to read the amaxes, then sets each scale to 448 / amax
(one step of delayed scaling), so the gradients it returns are as well scaled as a training loop's after its
first step. Per-tensor descales only; `cudnn` is imported inside functions (lab.fp8.peer.require).
"""
from __future__ import annotations

import math

import torch

from . import peer, quant

E4M3_MAX = 448.0
BWD_SCALARS = ("descale_q", "descale_k", "descale_v", "descale_o", "descale_dO", "descale_s", "descale_dP",
               "scale_s", "scale_dQ", "scale_dK", "scale_dV", "scale_dP")


class FP8Backward:
    """The forward (for O and Stats) and backward graphs bound to e4m3 inputs and a dO; `call()` runs the
    backward (what the race times), `grads()` returns dQ, dK, dV dequantised to float32."""

    def __init__(self, q: quant.Quantized, k: quant.Quantized, v: quant.Quantized, grad_out: torch.Tensor,
                 is_causal: bool = False):
        cudnn = peer.require()
        self.cudnn, self.causal = cudnn, bool(is_causal)
        B, H, S, D = q.data.shape
        self.scale = 1.0 / math.sqrt(D)
        self.inputs = (q, k, v)
        self.dout = quant.quantize(grad_out.float(), "e4m3", "tensor")
        self.o = torch.empty(B, H, S, D, dtype=torch.float8_e4m3fn, device="cuda")
        self.stats = torch.empty(B, H, S, 1, dtype=torch.float32, device="cuda")
        self.grads_fp8 = [torch.empty_like(x.data) for x in self.inputs]
        self.amax = {n: torch.zeros(1, 1, 1, 1, device="cuda") for n in ("s", "o", "dQ", "dK", "dV", "dP")}
        descale_o = v.scalar_descale()
        values = {"descale_q": q.scalar_descale(), "descale_k": k.scalar_descale(), "descale_v": v.scalar_descale(),
                  "descale_o": descale_o, "descale_dO": self.dout.scalar_descale(), "descale_s": 1 / E4M3_MAX,
                  "descale_dP": 1.0, "scale_s": E4M3_MAX, "scale_o": 1 / descale_o, "scale_dQ": 1.0,
                  "scale_dK": 1.0, "scale_dV": 1.0, "scale_dP": 1.0}
        self.scalars = {n: torch.full((1, 1, 1, 1), float(x), device="cuda") for n, x in values.items()}
        self.handle = cudnn.create_handle()
        try:
            cudnn.set_stream(self.handle, torch.cuda.current_stream().cuda_stream)
            self._forward_graph()
            self._backward_graph()
            size = max(self.fwd.get_workspace_size(), self.bwd.get_workspace_size(), 1)
            self.workspace = torch.empty(size, dtype=torch.uint8, device="cuda")
            self.fwd.execute(self.fwd_pack, self.workspace, handle=self.handle)
            self.call()
            self._rescale()
        except BaseException:
            self.close()
            raise

    def _graph(self):
        c = self.cudnn
        return c.pygraph(io_data_type=c.data_type.FP8_E4M3, intermediate_data_type=c.data_type.FLOAT,
                         compute_data_type=c.data_type.FLOAT, handle=self.handle)

    def _t(self, graph, x: torch.Tensor, fp8: bool = True):
        dtype = self.cudnn.data_type.FP8_E4M3 if fp8 else self.cudnn.data_type.FLOAT
        return graph.tensor(dim=list(x.shape), stride=list(x.stride()), data_type=dtype)

    def _out(self, t, buffer, fp8: bool):
        dtype = self.cudnn.data_type.FP8_E4M3 if fp8 else self.cudnn.data_type.FLOAT
        t.set_output(True).set_dim(list(buffer.shape)).set_stride(list(buffer.stride())).set_data_type(dtype)

    def _forward_graph(self):
        g = self.fwd = self._graph()
        q, k, v = (self._t(g, x.data) for x in self.inputs)
        ports = {n: self._t(g, self.scalars[n], False) for n in ("descale_q", "descale_k", "descale_v", "descale_s",
                                                                "scale_s", "scale_o")}
        o, stats, amax_s, amax_o = g.sdpa_fp8(q=q, k=k, v=v, **ports, generate_stats=True, attn_scale=self.scale,
                                              use_causal_mask=self.causal, name="fwd")
        self._out(o, self.o, True)
        self._out(stats, self.stats, False)
        self._out(amax_s, self.amax["s"], False)
        self._out(amax_o, self.amax["o"], False)
        peer.build_plans(self.cudnn, g)
        self.fwd_pack = {q: self.inputs[0].data, k: self.inputs[1].data, v: self.inputs[2].data, o: self.o,
                         stats: self.stats, amax_s: self.amax["s"], amax_o: self.amax["o"],
                         **{ports[n]: self.scalars[n] for n in ports}}

    def _backward_graph(self):
        g = self.bwd = self._graph()
        q, k, v = (self._t(g, x.data) for x in self.inputs)
        o, d_o, stats = self._t(g, self.o), self._t(g, self.dout.data), self._t(g, self.stats, False)
        ports = {n: self._t(g, self.scalars[n], False) for n in BWD_SCALARS}
        outs = g.sdpa_fp8_backward(q=q, k=k, v=v, o=o, dO=d_o, stats=stats, **ports, attn_scale=self.scale,
                                   use_causal_mask=self.causal, name="bwd")
        dq, dk, dv, amax_dq, amax_dk, amax_dv, amax_dp = outs
        for t, buffer in zip((dq, dk, dv), self.grads_fp8):
            self._out(t, buffer, True)
        for t, name in zip((amax_dq, amax_dk, amax_dv, amax_dp), ("dQ", "dK", "dV", "dP")):
            self._out(t, self.amax[name], False)
        peer.build_plans(self.cudnn, g)
        self.bwd_pack = {q: self.inputs[0].data, k: self.inputs[1].data, v: self.inputs[2].data, o: self.o,
                         d_o: self.dout.data, stats: self.stats, dq: self.grads_fp8[0], dk: self.grads_fp8[1],
                         dv: self.grads_fp8[2], amax_dq: self.amax["dQ"], amax_dk: self.amax["dK"],
                         amax_dv: self.amax["dV"], amax_dp: self.amax["dP"],
                         **{ports[n]: self.scalars[n] for n in ports}}

    def _rescale(self):
        """One step of delayed scaling: each output scale from the unit-scale run's amax, then run again."""
        torch.cuda.synchronize()
        for name in ("dQ", "dK", "dV", "dP"):
            amax = float(self.amax[name])
            scale = E4M3_MAX / amax if amax > 0 and math.isfinite(amax) else 1.0
            self.scalars[f"scale_{name}"].fill_(scale)
            if name == "dP":
                self.scalars["descale_dP"].fill_(1.0 / scale)
        self.call()
        torch.cuda.synchronize()

    def call(self):
        self.bwd.execute(self.bwd_pack, self.workspace, handle=self.handle)

    def grads(self) -> list[torch.Tensor]:
        return [g.float() / self.scalars[f"scale_{n}"].flatten()[0] for g, n in zip(self.grads_fp8, ("dQ", "dK", "dV"))]

    def close(self) -> None:
        if self.handle is not None:
            self.cudnn.destroy_handle(self.handle)
            self.handle = None

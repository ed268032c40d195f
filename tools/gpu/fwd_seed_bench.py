"""Small-S ("seed") latency: v04 builds (through ctypes) against every SDPA backend, one process.

Shapes: fp16, non-causal, B=4, H=8, S in {32, 64, 128, 256, 512}, plus H=16 at S=128, for
D=64 (the seed shapes) and D=128. Each timed call: L2 flushed (zero a buffer of 2x L2),
CUDA events around the one call, median of --reps runs; calls of all contenders are
interleaved round-robin so drift hits all alike. The v04 launchers are called through
ctypes on a params struct built once per shape (lab's torch binding builds it per call,
so its host overhead is a little higher). Each library's output is checked against
SDPA's math backend first. Usage (GPU machine):
    python3 tools/gpu/fwd_seed_bench.py NAME=path/to/lib.so[:symbol] ... [--reps 200]
Libraries: nvcc -O3 -shared -Xcompiler -fPIC -I kernels -gencode arch=compute_90a,code=sm_90a
kernels/fwd/v04_lazy.cu -o lib.so.
"""
import ctypes
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


class Params(ctypes.Structure):
    _fields_ = [("q", ctypes.c_void_p), ("k", ctypes.c_void_p), ("v", ctypes.c_void_p),
                ("o", ctypes.c_void_p), ("lse", ctypes.c_void_p),
                ("q_stride", ctypes.c_int64 * 3), ("k_stride", ctypes.c_int64 * 3),
                ("v_stride", ctypes.c_int64 * 3), ("o_stride", ctypes.c_int64 * 3),
                ("batch", ctypes.c_int), ("heads_q", ctypes.c_int), ("heads_kv", ctypes.c_int),
                ("seqlen_q", ctypes.c_int), ("seqlen_k", ctypes.c_int), ("head_dim", ctypes.c_int),
                ("scale", ctypes.c_float), ("causal", ctypes.c_int), ("dtype", ctypes.c_int),
                ("debug", ctypes.c_void_p)]


def main():
    args = sys.argv[1:]
    reps = 200
    if "--reps" in args:
        i = args.index("--reps")
        reps = int(args[i + 1])
        del args[i:i + 2]
    libs = []
    for a in args:
        name, path = a.split("=", 1)
        sym = "attn_fwd_v04"
        if ":" in path:
            path, sym = path.split(":")
        fn = getattr(ctypes.CDLL(path), sym)
        fn.argtypes = [ctypes.POINTER(Params), ctypes.c_void_p]
        fn.restype = ctypes.c_int
        libs.append((name, fn))
    dev = torch.cuda.get_device_properties(0)
    print(f"torch {torch.__version__} on {dev.name} ({dev.multi_processor_count} SMs), reps={reps}", flush=True)
    l2 = getattr(dev, "L2_cache_size", 64 * 2**20)
    flush = torch.empty(max(2 * l2, 64 * 2**20) // 4, dtype=torch.float32, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream
    torch.manual_seed(0)
    backends = [("flash", [SDPBackend.FLASH_ATTENTION]), ("cudnn", [SDPBackend.CUDNN_ATTENTION]),
                ("efficient", [SDPBackend.EFFICIENT_ATTENTION]), ("default", None)]
    for D in (64, 128):
        for (B, H, S) in ((4, 8, 32), (4, 8, 64), (4, 8, 128), (4, 8, 256), (4, 8, 512), (4, 16, 128)):
            q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.float16) for _ in range(3))
            o = torch.empty_like(q)
            with sdpa_kernel([SDPBackend.MATH]):
                ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float())
            p = Params()
            p.q, p.k, p.v, p.o, p.lse = q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), None
            for f in ("q_stride", "k_stride", "v_stride", "o_stride"):
                getattr(p, f)[:] = [H * S * D, S * D, D]
            p.batch, p.heads_q, p.heads_kv, p.seqlen_q, p.seqlen_k, p.head_dim = B, H, H, S, S, D
            p.scale, p.causal, p.dtype, p.debug = D ** -0.5, 0, 0, None
            pref = ctypes.byref(p)
            fns = []
            for name, fn in libs:
                o.fill_(float("nan"))
                rc = fn(pref, stream)
                torch.cuda.synchronize()
                err = (o.float() - ref).abs().max().item()
                ok = rc == 0 and err < 2e-3
                print(f"check {name} D={D} B={B} H={H} S={S}: rc={rc} max|dO|={err:.1e} {'ok' if ok else 'FAIL'}", flush=True)
                fns.append((name, lambda fn=fn: fn(pref, stream)))
            for name, bk in backends:
                def call(bk=bk):
                    if bk is None:
                        F.scaled_dot_product_attention(q, k, v)
                    else:
                        with sdpa_kernel(bk):
                            F.scaled_dot_product_attention(q, k, v)
                try:
                    call()
                    torch.cuda.synchronize()
                    fns.append(("sdpa-" + name, call))
                except RuntimeError as e:
                    print(f"sdpa-{name} D={D} S={S}: unavailable ({str(e).splitlines()[0][:80]})")
            times = {n: [] for n, _ in fns}
            for r in range(reps + 5):
                for n, fn in fns:
                    flush.zero_()
                    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    e0.record()
                    fn()
                    e1.record()
                    e1.synchronize()
                    if r >= 5:
                        times[n].append(e0.elapsed_time(e1) * 1e3)
            med = {n: statistics.median(t) for n, t in times.items()}
            sd = {n: m for n, m in med.items() if n.startswith("sdpa-")}
            best = min(sd, key=sd.get)
            row = "  ".join(f"{n}={m:6.2f}" for n, m in med.items())
            print(f"seed fp16 D={D:<3d} B={B} H={H:<2d} S={S:<4d} us: {row}  | fastest {best} {sd[best]:.2f}", flush=True)
            print("ratio " + " ".join(f"{n}={med[n] / sd[best]:.3f}" for n, _ in libs) + f"  (D={D} H={H} S={S})", flush=True)
            del q, k, v, o, ref


if __name__ == "__main__":
    main()

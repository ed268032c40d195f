"""PyTorch SDPA (cuDNN and flash backends) on the bench-decode grid of tools/gpu/decode_main.cu.

q (B, 32, 1, 128), k/v (B, Hkv, L, 128) bf16, enable_gqa=True; Hkv {32, 8}, batch {1, 8, 64}, L {4k, 16k, 32k,
64k}, cells with K+V > 9 GiB skipped (as the driver). KV buffers rotated over >= 256 MiB, 3 warm-ups, median of
30 CUDA-event-timed calls, GB/s counts K + V + Q + O once (as the driver). Run on the GPU machine:
    python3 tools/gpu/sdpa_decode_bench.py
"""
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from event_timing import median_ms  # tools/gpu/event_timing.py (this script's folder is on sys.path)

BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}


def main():
    dev = torch.cuda.get_device_properties(0)
    print(f"torch {torch.__version__} on {dev.name} ({dev.multi_processor_count} SMs)", flush=True)
    Hq, D, T = 32, 128, 1
    for Hkv in (32, 8):
        for B in (1, 8, 64):
            for L in (4096, 16384, 32768, 65536):
                kv_bytes = 2 * B * Hkv * L * D * 2
                if kv_bytes > 9 * 2**30:
                    continue
                nbuf = min(16, max(1, -(-(256 << 20) // kv_bytes)))
                kv = [torch.randn(2, B, Hkv, L, D, device="cuda", dtype=torch.bfloat16) for _ in range(nbuf)]
                q = torch.randn(B, Hq, T, D, device="cuda", dtype=torch.bfloat16)
                nbytes = kv_bytes + 2 * q.numel() * 2
                line = f"Hkv{Hkv:2d} B{B:2d} L{L:5d}:"
                for name, be in BACKENDS.items():
                    try:
                        with sdpa_kernel(be):
                            def call(i):
                                return F.scaled_dot_product_attention(q, kv[i % nbuf][0], kv[i % nbuf][1],
                                                                      enable_gqa=True)
                            med = median_ms(call, 3, 30)
                        line += f"  {name} {med * 1e3:9.1f} us {nbytes / (med * 1e-3) / 1e9:6.0f} GB/s"
                    except Exception as exc:  # a backend refusing the shape
                        line += f"  {name} n/a ({type(exc).__name__}: {str(exc).splitlines()[0][:60]})"
                print(line, flush=True)
                del kv, q
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

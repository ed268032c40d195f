"""PyTorch SDPA flash backend (FlashAttention-2) on the v02 bench grid.

Same grid and timing as tools/gpu/fwd_mma_main.cu's bench: bf16, D in {64,128},
S in {512,2048,8192,16384}, causal in {0,1}, B = 32768/S, H = 2048/D, contiguous
(B, H, S, D), randn inputs, median of 25 CUDA-event-timed calls after 3 warm-ups,
TFLOP/s from 4*B*H*S*S*D (halved for causal). Run on the GPU machine:
    python3 tools/gpu/sdpa_flash_bench.py
"""
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from event_timing import median_ms  # tools/gpu/event_timing.py (this script's folder is on sys.path)


def main():
    dev = torch.cuda.get_device_properties(0)
    print(f"torch {torch.__version__} on {dev.name} ({dev.multi_processor_count} SMs), "
          f"SDPA backend FLASH_ATTENTION")
    torch.manual_seed(0)
    for D in (64, 128):
        for S in (512, 2048, 8192, 16384):
            B, H = 32768 // S, 2048 // D
            q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            for causal in (0, 1):
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    med = median_ms(lambda _: F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal)), 3, 25)
                flops = 4.0 * B * H * S * S * D * (0.5 if causal else 1.0)
                print(f"sdpa-flash bf16 D={D:<3d} S={S:<5d} causal={causal} B={B:<2d} H={H:<2d} "
                      f"{med:8.3f} ms  {flops / (med * 1e-3) / 1e12:6.1f} TFLOP/s", flush=True)
            del q, k, v


if __name__ == "__main__":
    main()

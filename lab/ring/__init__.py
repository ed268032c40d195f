"""The ring family: context-parallel attention over torch.distributed. The algorithm and its CPU emulation
(attention: lab.ring.ring_attention), the transport (comm), the torchrun entry that records checks, scaling
and the largest sequence (run: `torchrun --nproc-per-node 2 -m lab.ring.run`), and chapter n12's side (report).
"""
from .attention import ring_attention  # noqa: F401 (lab.ring.ring_attention: the public call)

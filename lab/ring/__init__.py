"""The ring family: context-parallel attention over torch.distributed. The algorithm and its CPU emulation
(attention: lab.ring.ring_attention; its backward: backward), the layout and blocks (blocks), the transport
(comm), a model trained sharded over the ring (train), torch's own context parallel for comparison (torch_cp),
the torchrun entry that records checks, scaling, communication and the largest sequence (run, with its stages in
stages_fwd and stages_bwd: `torchrun --nproc-per-node 2 -m lab.ring.run`), and chapter n12's side (report,
report_bwd).
"""
from .attention import ring_attention  # noqa: F401 (lab.ring.ring_attention: the public call)

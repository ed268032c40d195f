"""The masks and batches real models use: sliding windows, logit softcapping, attention sinks and packed
variable-length sequences (lab.ops.attention's window_size / softcap / sinks, lab.ops.attention_varlen).

spec: the arguments checked and the mask written out once (which key each query row sees, the tile range a
block of rows reads); reference: float64 attention with that mask, differentiable; emulate: the tiled algorithm
on the CPU (tiles outside the window skipped and counted, softcap in the exp2 step, sinks in the normaliser,
the varlen tile scheduler) and the backward formulas; op: the public calls and the kernel launch; fast: the
eager calls in one crossing of the binding (a plan memoised per shape); paged: attention_varlen over a paged KV
cache (block_table; emulate_paged, gpu_paged).
"""

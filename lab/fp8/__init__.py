"""FP8 attention's groundwork: the formats, where precision goes, and cuDNN's FP8 forward as a measured peer.

One job per module:

* ``quant``   -- e4m3 / e5m2 as data (range, spacing), amax scales per tensor or per head, with
  FlashAttention-3's descale semantics: x ~= x_fp8 * descale;
* ``emulate`` -- an FP8 attention forward in float32 torch on any device (P quantised before P V), a
  float64 reference over chosen query rows, and the error budget with and without outlier channels;
* ``peer``    -- cuDNN's FP8 forward (``cudnn.pygraph``'s ``sdpa_fp8``) built and executed on torch tensors;
* ``race``    -- the race cells, timing against bf16 SDPA-cuDNN and the accuracy of both, as records;
* ``report``  -- the chapter's tables, figures and findings (n15_fp8);
* ``op``      -- the lab's own FP8 forward, ``lab.ops.attention_fp8`` (fwd v13, sm_90a), FA3's arguments;
* ``checks``  -- its GPU checks: float64 on the dequantised inputs, against cuDNN FP8 and the emulation;
* ``backward`` -- training through it, ``attention_fp8_train`` (the backward by the FP8 kernel or in bf16);
* ``kernel_bwd`` -- the FP8 backward kernel's call (bwd v22, sm_90a): its parameter block, workspaces, errors.

``peer`` and ``race`` import ``cudnn`` inside their functions only, so the package imports without it.
"""

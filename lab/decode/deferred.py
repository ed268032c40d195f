"""lab.ops.decode's default paged call (no page_errors): the kernel's flags are read at a later call, never waited for.

Why: a bad block table must not go unnoticed, but reading the kernel's per-sequence flags right after the call
(lab.decode.op.raise_page_errors) waits for the GPU on every step and takes the slow Python path. On an H200 that
call ran at 0.78x our contiguous decode (15 cells of chapter n11's race, 0.66-0.88), against 0.97x for the call
with page_errors.

How (lab/binding.cpp, "the deferred call's page flags"): the call goes into the binding in one crossing, as the
page_errors call does. The kernel writes its flags into a slot of pinned host memory through the slot's device
alias, and an event is recorded after it; the slot waits in a queue per device. Chosen over a device buffer copied
to the host after the kernel: that copy is one more node on the stream per step (a few microseconds against a
kernel of tens) and one more host API call; the kernel writes one int per sequence, so writing to the host
directly costs nothing measurable. Each later default paged call on that device first retires the slots whose
event has completed (event queries, no wait) and, if one has a flag set, raises ValueError instead of launching.
Other lab.ops.decode calls do the same while slots are queued (one crossing, none otherwise). Retired slots are
reused: a decoding loop allocates nothing once warm, and with 64 slots queued a call waits for the oldest.

The price is that the error comes late: at the next call after the GPU has run the bad one, or at
check_page_errors(), which waits. The bad call's outputs for the flagged sequences are zeros (the kernel never
reads outside the cache). Under CUDA-graph capture and torch.compile nothing is read, as before: pass page_errors
there. A call given page_errors reads nothing either; the flags are the caller's.
"""
from __future__ import annotations

from .. import build
from .plan import ERROR_NAMES

queued = False  # a default paged call may have flags in the binding's queue: other decode calls poll while True


def named_flags(rows) -> str:
    """'1 (a page index outside [0, num_pages)), 4 (...)' for [(sequence, flag bits)]."""
    return ", ".join(f"{b} ({' and '.join(text for bit, text in ERROR_NAMES.items() if bits & bit)})"
                     for b, bits in rows)


def error(bad) -> ValueError:
    """The ValueError for the binding's bad slots [(device, call number, flags (B,) int32 on the CPU)]: which
    earlier call, which sequences, why, and that their outputs were zeros."""
    calls = []
    for device, call, flags in bad:  # flags: a CPU copy of the pinned slot, read with no sync
        rows = [(b, bits) for b, bits in enumerate(flags.tolist()) if bits]
        calls.append(f"call {call} on cuda:{device}: block_table is bad for sequence(s) {named_flags(rows)}")
    return ValueError(f"an earlier paged lab.ops.decode call without page_errors had a bad block table ("
                      f"{'; '.join(calls)}); that call's outputs for those sequences are zero. The flags are read "
                      f"once the GPU has run the call, so this error comes at a later call or at "
                      f"lab.ops.check_page_errors(); pass page_errors=<int32 (B,) tensor> to receive them yourself.")


def call(launcher: int, query, key_cache, value_cache, cache_seqlens, block_table, scale: float, num_splits: int,
         is_causal: bool, masks=None):
    """The deferred call through the binding: (error message or "", out); ValueError if a completed earlier call
    had a bad table (then nothing ran). masks: (window_left, window_right, softcap, sinks) of a masked call
    (lab.decode.masks), or None."""
    global queued
    module = build.binding().module
    if masks is None:
        error_text, out, bad = module.decode_paged_deferred(
            launcher, query, key_cache, value_cache, cache_seqlens, block_table, scale, num_splits, is_causal)
    else:
        error_text, out, bad = module.decode_masked_deferred(
            launcher, query, key_cache, value_cache, cache_seqlens, block_table, scale, num_splits, is_causal, *masks)
    if bad:
        raise error(bad)
    queued = True
    return error_text, out


def poll(wait: bool = False) -> None:
    """Retire the queued flags of every device (wait: all of them, else those the GPU has finished) and raise the
    ValueError of any bad one; a CUDA error is a RuntimeError."""
    global queued
    error_text, bad, left = build.binding().module.page_flags_check(wait)
    queued = left > 0
    if error_text:
        raise RuntimeError(error_text)
    if bad:
        raise error(bad)


def check_page_errors() -> None:
    """Wait for every paged lab.ops.decode call made without page_errors and raise ValueError if any had a bad
    block table, naming the call, the sequences and the reasons (their outputs were zeros).

    Those calls never wait for the GPU: their flags are read at a later decode call once the GPU has run them, or
    here. Call this where you want the error at a known point (the end of a generation step, a test). It waits
    for the GPU (a host sync); under CUDA-graph capture it reads nothing. Nothing to do when no such call is
    queued: then it returns at once, without building the binding."""
    if queued:
        poll(wait=True)

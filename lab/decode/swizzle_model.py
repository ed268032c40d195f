"""The ring layouts of decode v06 (rows padded to D + 8 elements) and v07 / v08 (unpadded, chunk c of row r at
c ^ ((r & 7) >> shift), shift 0 at D 64 / 128, 1 at D 96, 2 at D 80: common/decode_swizzle.cuh) counted on the CPU,
lane by lane, as the kernels address them (kernels/decode/v06_warpring.cu, v07_swizzle.cu, v08_swizzle_narrow.cu):

  - the layout is right: every 16-byte chunk of a 64-key tile is written by exactly one copy, and every ldmatrix
    lane address of S = Q K^T and O += P V reads the chunk that holds the logical (key, column) it must;
  - shared-memory wavefronts: per quarter-warp of a 16-byte copy (cp.async) and per 8-lane matrix of ldmatrix, the
    most accesses that fall in one bank quad (1 = conflict-free);
  - destination chunks: the aligned 128-byte shared-memory chunks each copy instruction writes, x 4 sectors (over
    the instruction, and row by row), against the global sectors its addresses need: a hypothesis for the 1.5x
    crossbar sectors of v03 / v06 against cuDNN (outputs/experiments/20261126-paged-hint-probe.json);
  - split sectors: each 32-byte global sector counted once per aligned 32-byte shared sector its two chunks land in
    (the other hypothesis: 1.50x for the padded ring at D 128, the measured ratio, 1.00x swizzled).

    python -m lab.decode.swizzle_model        # prints one table per head dim; exits 1 if a layout check fails

tests/decode/test_decode_swizzle.py asserts the same checks.
"""
from __future__ import annotations

import sys

BLOCK_N, SLICE, WARPS, ELEM = 64, 16, 4, 2  # keys a tile, keys a warp, warps, bytes of bf16 / fp16


def shift(D: int) -> int:
    """common/decode_swizzle.cuh's SwizzleRows<D>::kShift: 8 consecutive rows start n r chunks in (n = D / 8), whose
    bank quads (n r mod 8) repeat every 8 / gcd(n, 8) rows; the XOR term (r & 7) >> shift tells those repeats apart."""
    n = D // 8
    return 0 if n % 8 == 0 else (1 if n % 4 == 0 else 2)


def offset(layout: str, D: int, row: int, chunk: int) -> int:
    """Byte offset of 16-byte chunk `chunk` of key row `row` in a K (or V) tile."""
    if layout == "padded":
        return row * (D + 8) * ELEM + chunk * 16
    if layout == "unpadded":  # rows D apart with no swizzle: only the wrong reader below uses it
        return row * D * ELEM + chunk * 16
    return row * D * ELEM + (chunk ^ ((row & 7) >> shift(D))) * 16


def copies(D: int):
    """Per copy instruction (warp, i): the 32 lanes' (row, chunk) or None (a lane past D / 8), as the kernels."""
    vec_per_row = D // 8
    slots = 8 if vec_per_row <= 8 else (16 if vec_per_row <= 16 else 32)
    step = 32 // slots
    for warp in range(WARPS):
        for i in range(SLICE // step):
            lanes = []
            for lane in range(32):
                r0, c = lane // slots, lane % slots
                lanes.append((warp * SLICE + r0 + i * step, c) if c < vec_per_row else None)
            yield lanes


def ldmatrix_lanes(D: int):
    """Per ldmatrix.x4 (K non-trans, V trans) of each warp and k-step: the 32 lanes' (row, chunk), as warp_kv_lanes."""
    for warp in range(WARPS):
        for kk in range(D // 16):
            k = [(warp * 16 + (l & 7) + ((l >> 4) << 3), 2 * kk + ((l >> 3) & 1)) for l in range(32)]
            v = [(warp * 16 + (l & 7) + (((l >> 3) & 1) << 3), 2 * kk + (l >> 4)) for l in range(32)]
            yield k
            yield v


def worst_quad(addresses) -> int:
    quads = {}
    for a in addresses:
        quads[(a // 16) % 8] = quads.get((a // 16) % 8, 0) + 1
    return max(quads.values())


def model(layout: str, D: int, read_layout: str | None = None) -> dict:
    written = {}
    copy_wave = dest_sectors = row_sectors = need_sectors = split_sectors = 0
    for lanes in copies(D):
        for q in range(4):
            quarter = [offset(layout, D, *rc) for rc in lanes[8 * q:8 * q + 8] if rc]
            copy_wave += worst_quad(quarter) if quarter else 0
        dst = {offset(layout, D, *rc) // 128 for rc in lanes if rc}
        dest_sectors += 4 * len(dst)
        rows = {rc[0] for rc in lanes if rc}
        row_sectors += 4 * sum(len({offset(layout, D, *rc) // 128 for rc in lanes if rc and rc[0] == r}) for r in rows)
        need_sectors += len({(row, chunk // 2) for row, chunk in (rc for rc in lanes if rc)})  # 32-byte sectors
        landing = {}  # global sector (row, chunk // 2) -> the shared 32-byte sectors its chunks land in
        for row, chunk in (rc for rc in lanes if rc):
            landing.setdefault((row, chunk // 2), set()).add(offset(layout, D, row, chunk) // 32)
        split_sectors += sum(len(v) for v in landing.values())
        for rc in lanes:
            if rc:
                a = offset(layout, D, *rc)
                written[a] = written.get(a, []) + [rc]
    layout_ok = all(len(v) == 1 for v in written.values()) and len(written) == BLOCK_N * D // 8
    reads_ok, ld_wave, ld_count = True, 0, 0
    for lanes in ldmatrix_lanes(D):
        addresses = [offset(read_layout or layout, D, *rc) for rc in lanes]
        reads_ok &= all(written.get(a) == [rc] for a, rc in zip(addresses, lanes))
        ld_wave += sum(worst_quad(addresses[8 * m:8 * m + 8]) for m in range(4))
        ld_count += 4
    n_copies = len(list(copies(D)))
    return {"ok": layout_ok and reads_ok, "copy_wavefronts": copy_wave / (4 * n_copies),
            "ldmatrix_wavefronts": ld_wave / ld_count, "dest_sectors": dest_sectors / n_copies,
            "row_sectors": row_sectors / n_copies, "split_sectors": split_sectors / n_copies,
            "need_sectors": need_sectors / n_copies}


def main() -> int:
    failed = False
    for D in (64, 80, 96, 128):
        print(f"D {D}: per copy instruction (a warp's 32 lanes), per quarter-warp / 8-lane matrix")
        print(f"  {'layout':8} {'ok':>3} {'copy wf':>8} {'ldsm wf':>8} {'dst chunks x4':>14} {'per row':>8} "
              f"{'split':>6} {'needed':>7} {'ratios':>18}")
        for layout in ("padded", "unpadded", "swizzled"):
            m = model(layout, D)
            failed |= layout == "swizzled" and not (m["ok"] and m["ldmatrix_wavefronts"] == 1 == m["copy_wavefronts"]
                                                    and m["split_sectors"] == m["need_sectors"])
            print(f"  {layout:8} {'yes' if m['ok'] else 'NO':>3} {m['copy_wavefronts']:8.2f} "
                  f"{m['ldmatrix_wavefronts']:8.2f} "
                  f"{m['dest_sectors']:14.2f} {m['row_sectors']:8.2f} {m['split_sectors']:6.2f} {m['need_sectors']:7.2f} "
                  f"{m['dest_sectors'] / m['need_sectors']:6.3f} {m['row_sectors'] / m['need_sectors']:5.3f} "
                  f"{m['split_sectors'] / m['need_sectors']:5.3f}")
        wrong = model("swizzled", D, read_layout="unpadded")["ok"]  # a reader that forgets the XOR must fail
        print(f"  swizzled copies read without the XOR: {'passes (WRONG)' if wrong else 'fails, as it must'}")
        failed |= wrong
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

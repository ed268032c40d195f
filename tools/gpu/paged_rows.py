"""The A/B rows of the paged decode probes beside it (paged_loader_probe.py, paged_lean.py): per timed call of a
cell, one JSON line in `out` and one printed line, its GPU time against SDPA-cuDNN's from the same rounds."""
import json

from lab import bench


def write_rows(out, cell: str, times: dict, **extra) -> None:
    """times: lab.bench.time_interleaved's answer, with an 'sdpa-cudnn' entry; extra: fields every row carries."""
    base = times["sdpa-cudnn"]
    for name, t in times.items():
        if not isinstance(t, bench.Timing):
            print(f"{cell} {name}: {t}", flush=True)
            continue
        row = {"cell": cell, "impl": name, "gpu_us": round(t.median_ms * 1e3, 2), "iqr_us": round(t.iqr_ms * 1e3, 2),
               "n": t.n, "x_cudnn": round(base.median_ms / t.median_ms, 4) if isinstance(base, bench.Timing) else None,
               **extra}
        out.write(json.dumps(row) + "\n")
        print(f"{cell:>9} {name:<28} {row['gpu_us']:8.2f} us  iqr {row['iqr_us']:5.2f}  x cuDNN {row['x_cudnn']}",
              flush=True)

"""cv18xx int8 builds of smallcnn, a resnet18-shaped 224x224 model, PP-LCNet and MTCNN O-Net against tpu-mlir.

    .venv/bin/python bench/cv18xx.py [--chips cv183x,cv181x] [--samples 4]

Each (model, chip) builds in a fresh child process, so its peak RSS is its own. Reported per build:
- build time: wall seconds of canonicalize + compile_cvimodel in-process (the ONNX import excluded); "cold"
  is the first build in the process (lazy imports and caches included), "warm" the best of two more;
- peak memory: tracemalloc's peak of Python and numpy allocations during one more build, and the process
  peak RSS (VmHWM of /proc/self/status) of a pure compile: imports, the ONNX import and the cold build, taken
  before any other build runs (what `npuc build` costs; the CLI itself adds its own imports: resnet18_224
  cv183x `/usr/bin/time -f %M npuc build ...` 198 MiB); getrusage's ru_maxrss is not used because Linux
  carries it over from the parent across fork and exec;
- artifact bytes, shared + private gmem, DDR bytes the TDMA moves (backends/cv18xx/traffic.py) with the
  default options and with layer_group=False, the lower bound (weights as stored + TPU inputs + outputs
  once) and the ratio of the traffic to it; the goals also give the artifact and the DDR bytes of the build
  with raw (uncompressed) filters, compress_weights=False;
- cycles and overlap: the two-engine schedule of the cmdbufs under their sync ids (backends/cv18xx/timing.py,
  a nominal cost model): the scheduled cycles, the share of the fully serial time the parallel ids hide, and
  the same build with sync="serial" for comparison (0 by construction); then npuc's cycles, overlap and DDR
  bytes next to tpu-mlir's (its cvimodel in ../shared/golden/cv18xx where present, scored by the same cost
  model; for resnet18_224 the figures measured in issue 23).
resnet18_224 is calibrated in-process (npuc's KL calibration) on a few scikit-image photos, PP-LCNet
(pplcnet_orientation) and O-Net (mtcnn_onet), both fetched, on their real pictures.

Measured (`--chips cv183x`, quiet machine), cycles npuc / tpu-mlir: smallcnn 28,834 / 30,194, resnet18_224
3,782,414 / 3.92 M, pplcnet 422,638 / 434,211, onet 50,878 / 52,420; overlap 14.8% / 12.0%, 14.8% / 17.5%,
13.3% / 10.0%; DDR bytes 13,995,760 / 12,800,000, 2,580,760 / 2,967,656, 419,280 / 389,056. Before layer groups
were cut by cost and O-Net's fully-connected layer used every lane: 4,140,718, 483,916 and 73,138 cycles. With
fully-connected weights VLC-compressed per column tile (as tpu-mlir stores O-Net's): onet 44,887 cycles and
323,360 DDR bytes (tpu-mlir's file: 199,520 compressed bytes for the same 1152x256 weights).
The cuts trade gmem for cycles where tiles are short: resnet18_224 on cv181x (8 lanes) runs in 14.60 M cycles
against 16.59 M with the longest groups, but three 64x56x56 tensors are alive at once, shared gmem 602,112 B
against 401,408 B, so its "gmem no larger" line (against tpu-mlir's cv183x figure) misses; `--option
layer_group=longest` gives the smaller footprint back.
Since a one-tile group may stream its convs' filters (kernels/group_stream.py) and a conv reads the leading rows
of a slot, resnet18_224's stages 2-4 (28x28 to 7x7, 3x3 filters up to 4.6 KB a lane per 32 channels) are one
group: cv183x 3,661,090 cycles (was 3,779,855), 12,335,744 DDR bytes against tpu-mlir's 12.8 M (was 13,954,816),
overlap 15.6%; cv181x 14,563,723 cycles, 15,808,096 bytes; PP-LCNet and O-Net byte-identical.
Since a group takes shorter double-buffered tiles where the pipelined price is lower (group_plan.tile_height),
cv183x npuc / tpu-mlir: resnet18_224 3,645,083 cycles, overlap 16.1%, 12,349,856 B; PP-LCNet 411,357 / 434,211,
overlap 17.7% / 17.5%, 2,594,184 B; O-Net unchanged. YOLOv8n 3.30 -> 3.21 M, PicoDet 12.34 -> 11.69 M.
Since a segment is grouped in chain order where that costs less (passes/lowering/chain_order.py): YOLOv8n 320
cv183x 3.21 -> 2.96 M cycles, 21.7 -> 17.2 MB DDR; PP-OCRv6 det 2.03 -> 1.84 M, 16.6 -> 13.7 MB; PicoDet 11.69
-> 9.00 M, 93.7 -> 51.3 MB; the four models here unchanged on cv183x.
The vendor simulator reports no timing, so the external check of the nominal model is the vendor compiler's own
cost formulas (backends/cv18xx/vendor_cost.py): the same files priced under both, and each build's candidate
schedules (default, layer_group=false, compress_weights=false, layer_group=longest, sync=serial) ranked under
both. Measured (cv183x), vendor-formula cycles npuc / tpu-mlir's file: smallcnn 31,513 / 18,691, pplcnet
631,258 / 497,871, onet 71,440 / 52,014 (nominal: npuc ahead on all three): tpu-mlir pairs int8 input channels
(double_conv), which halves a conv's loop under those formulas and which npuc did not set. With double_conv set
where the chip allows it (bit-exact on the vendor simulator): 22,281, 506,023 (1.6% above tpu-mlir's), 60,560
(16% above: O-Net's per-channel depthwise ops cost at least 16 cycles a tile under them); resnet18_224 4.01 ->
2.40 M against tpu-mlir's 2.57 M (its file built live with TPU_MLIR_VENV: 3,921,292 nominal cycles). Rankings:
the same order under both models on every model but for the cheapest two, the default and
compress_weights=false, 0.05-0.23% apart under the vendor formulas (9 of 10 pairs alike on resnet18_224 and
pplcnet, 7 of 10 on smallcnn and onet, where variants tie).
The nominal model then priced paired channels too (twice the MACs a cycle): cv183x npuc / tpu-mlir smallcnn
19,490 / 16,242, resnet18_224 2,097,124 / 2,208,184 (overlap 22.0% / 16.6%), pplcnet 287,785 / 300,219 (21.6% /
21.0%), onet 34,357 / 39,510 (18.5% / 12.8%).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

# the vendor files: $NPUC_SHARED/golden as the tests find them, else shared/ beside the repository
SHARED = Path(os.environ.get("NPUC_SHARED") or Path(__file__).resolve().parents[1].parent / "shared")
GOLDEN = SHARED / "golden" / "cv18xx"
TPU_MLIR = {  # measured here with tpu-mlir 1.30.2 on resnet18_224 (issue 4)
    "build_s": 1.8,
    "size": 11_758_400,
    "shared": 301_056,
    "private": 150_528,
}
TPU_MLIR_SCHEDULE = {  # tpu-mlir 1.30.2's cvimodels (cv183x int8) scored by timing.py / traffic.py (issue 23)
    "resnet18_224": {"cycles": 2_208_184, "overlap": 0.166, "ddr": 12_812_432},  # built live here
}
TPU_MLIR_FILES = {  # default: {name}_{chip}_int8.cvimodel
    "pplcnet": "pplcnet_tpumlir_{chip}_int8.cvimodel",
    "onet": "onet_tpumlir_{chip}_int8.cvimodel",
}
REAL = {"pplcnet": "pplcnet_orientation", "onet": "mtcnn_onet"}  # bench name -> npuc.models.fetch name
CANDIDATES = (("layer_group", "longest"), ("sync", "serial"))  # schedules ranked under both cost models
DDR_GOAL = 1.5  # traffic with layer groups within 1.5x of the lower bound
PHOTOS = ("astronaut", "coffee", "chelsea", "rocket", "immunohistochemistry", "colorwheel", "retina")


def _calibrate_resnet(folder: Path, count: int) -> tuple[Path, Path]:
    """(model, table): the generated resnet18_224 and a KL table from `count` ImageNet-normalized photos."""
    import numpy as np

    from npuc.models.images import IMAGENET_MEAN, IMAGENET_STD, load_image, normalize, resize, to_layout
    from npuc.models.make_models import make_all
    from npuc.passes.calibration.calibrate import CalibrationOptions, calibrate
    from npuc.passes.calibration.calitable import write_table

    model = make_all(folder, ["resnet18_224"])["resnet18_224"]
    samples = folder / "samples"
    samples.mkdir()
    for i, name in enumerate(PHOTOS[:count]):
        img = normalize(resize(load_image(name), 224, 224), 1 / 255, IMAGENET_MEAN, IMAGENET_STD)
        np.savez(samples / f"{i:02d}.npz", input=to_layout(img, "nchw"))
    result = calibrate(model, [samples], options=CalibrationOptions(method="kl"))
    table = folder / "resnet18_224_cali_table.txt"
    write_table(result.table, table)
    return model, table


def _calibrate_real(folder: Path, count: int, name: str) -> tuple[Path, Path, dict]:
    """(model, table, input shapes): real model `name` (fetched) and a KL table from `count` of its pictures."""
    import numpy as np

    from npuc.models.fetch import REAL_MODELS, fetch_model
    from npuc.models.images import model_inputs
    from npuc.passes.calibration.calibrate import CalibrationOptions, calibrate
    from npuc.passes.calibration.calitable import write_table

    model, shapes = fetch_model(name), REAL_MODELS[name].input_shapes
    paths = []
    for i, feed in enumerate(model_inputs(name, count)):
        paths.append(folder / f"{name}_{i:02d}.npz")
        np.savez(paths[-1], **feed)
    result = calibrate(model, paths, options=CalibrationOptions(method="kl"), input_shapes=shapes)
    table = folder / f"{name}_cali_table.txt"
    write_table(result.table, table)
    return model, table, {k: list(v) for k, v in shapes.items()}


def _build_once(model: Path, table: Path, chip: str, options: dict, shapes: dict | None = None
                ) -> tuple[float, bytes, dict]:  # fmt: skip
    from npuc.backends.cv18xx.build import compile_cvimodel
    from npuc.compiler.targets import BuildRequest
    from npuc.frontends.onnx import import_onnx
    from npuc.passes.rewrite.canonicalize import canonicalize

    graph = import_onnx(model, {k: tuple(v) for k, v in shapes.items()} if shapes else None, [])  # not timed
    start = time.perf_counter()
    canonicalize(graph)
    request = BuildRequest(graph, model, model.with_suffix(".cvimodel"), chip=chip, quant="int8",
                           calib_table=table, options=dict(options))  # fmt: skip
    data, summary = compile_cvimodel(request)
    return time.perf_counter() - start, data, summary


def _peak_rss_mb() -> float:
    """This process's peak resident set (VmHWM), in MiB; 0 where /proc is missing."""
    status = Path("/proc/self/status")
    lines = status.read_text().splitlines() if status.exists() else []
    kib = next((int(line.split()[1]) for line in lines if line.startswith("VmHWM:")), 0)
    return kib / 1024


def measure(model: Path, table: Path, chip: str, shapes: dict | None = None) -> dict:
    """All figures of one (model, chip) build; run in a fresh process."""
    from npuc.backends.cv18xx.container import read_cvimodel
    from npuc.backends.cv18xx.timing import schedule_model
    from npuc.backends.cv18xx.traffic import lower_bound, tdma_traffic
    from npuc.backends.cv18xx.vendor_cost import VENDOR_COSTS

    def build(options: dict) -> tuple[float, bytes, dict]:
        return _build_once(model, table, chip, options, shapes)

    cold, data, summary = build({})
    rss_mb = _peak_rss_mb()  # one pure compile, before the other builds' garbage
    warm = min(build({})[0] for _ in range(2))
    _, data_nolg, _ = build({"layer_group": False})
    _, data_raw, _ = build({"compress_weights": False})
    tracemalloc.start()
    build({})
    traced_peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    cvi, cvi_nolg = read_cvimodel(data), read_cvimodel(data_nolg)
    schedule = schedule_model(cvi)
    candidates = {"default": cvi, "layer_group=false": cvi_nolg, "compress_weights=false": read_cvimodel(data_raw)}
    candidates |= {f"{k}={v}": read_cvimodel(build({k: v})[1]) for k, v in CANDIDATES}
    return {
        "cold_s": cold,
        "warm_s": warm,
        "tracemalloc_mb": traced_peak / 2**20,
        "rss_mb": rss_mb,
        "size": len(data),
        "shared": summary["shared_gmem"],
        "private": summary["private_gmem"],
        "ddr": tdma_traffic(cvi)["total"],
        "ddr_nolg": tdma_traffic(cvi_nolg)["total"],
        "same_bytes_nolg": data == data_nolg,
        "size_raw": len(data_raw),
        "ddr_raw": tdma_traffic(read_cvimodel(data_raw))["total"],
        "bound": lower_bound(cvi)["total"],
        "cycles": schedule.scheduled,
        "overlap": schedule.overlap,
        "overlap_serial": schedule_model(candidates["sync=serial"]).overlap,
        "vendor_cycles": schedule_model(cvi, VENDOR_COSTS).scheduled,
        "candidates": {
            k: [schedule_model(m).scheduled, schedule_model(m, VENDOR_COSTS).scheduled] for k, m in candidates.items()
        },  # fmt: skip
    }


def _child(model: Path, table: Path, chip: str, shapes: dict | None = None) -> dict:
    cmd = [sys.executable, __file__, "--child", str(model), str(table), chip, json.dumps(shapes or {})]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        lines = (out.stderr or out.stdout).strip().splitlines() or ["(no output)"]
        return {"error": lines[-1]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def _row(name: str, chip: str, r: dict) -> str:
    if "error" in r:
        return f"{name:<14} {chip:<7} BUILD FAILED: {r['error']}"
    return (
        f"{name:<14} {chip:<7} {r['cold_s']:>7.2f} {r['warm_s']:>7.2f} {r['tracemalloc_mb']:>8.1f} {r['rss_mb']:>8.1f}"
        f" {r['size']:>11,} {r['shared'] + r['private']:>10,} {r['ddr']:>12,} {r['ddr_nolg']:>12,}"
        f" {r['bound']:>12,} {r['ddr'] / r['bound']:>6.2f} {r['overlap']:>8.1%} {r['overlap_serial']:>8.1%}"
    )


def _goals(chip: str, r: dict) -> list[str]:
    memory = r["shared"] + r["private"]
    tpu_memory = TPU_MLIR["shared"] + TPU_MLIR["private"]
    checks = [
        ("build no slower", r["cold_s"] <= TPU_MLIR["build_s"], f"{r['cold_s']:.2f} s cold vs {TPU_MLIR['build_s']} s"),
        (
            "artifact no larger",
            r["size"] <= TPU_MLIR["size"],
            f"{r['size']:,} B vs {TPU_MLIR['size']:,} B; {r['size_raw']:,} B with raw filters",
        ),
        (
            "gmem no larger",
            memory <= tpu_memory,
            f"shared {r['shared']:,} + private {r['private']:,} = {memory:,} B vs "
            f"{TPU_MLIR['shared']:,} + {TPU_MLIR['private']:,} = {tpu_memory:,} B",
        ),
        (
            f"DDR within {DDR_GOAL}x bound",
            r["ddr"] <= DDR_GOAL * r["bound"],
            f"{r['ddr']:,} B = {r['ddr'] / r['bound']:.2f}x of {r['bound']:,} B; {r['ddr_raw']:,} B with raw filters",
        ),
    ]
    return [f"  resnet18_224 {chip}: {name:<22} {'HOLDS' if ok else 'MISSED'}  ({what})" for name, ok, what in checks]


def _tpu_mlir_schedule(name: str, chip: str, live: dict | None = None) -> dict | None:
    """tpu-mlir's cycles, overlap and DDR bytes for the model: scored from its file (built live, or golden),
    else measured figures."""
    from npuc.backends.cv18xx.container import read_cvimodel
    from npuc.backends.cv18xx.timing import schedule_model
    from npuc.backends.cv18xx.traffic import tdma_traffic
    from npuc.backends.cv18xx.vendor_cost import VENDOR_COSTS

    path = GOLDEN / TPU_MLIR_FILES.get(name, "{name}_{chip}_int8.cvimodel").format(name=name, chip=chip)
    if (name, chip) not in (live or {}) and not path.exists():
        return TPU_MLIR_SCHEDULE.get(name) if chip == "cv183x" else None
    model = read_cvimodel((live or {}).get((name, chip), path))
    schedule = schedule_model(model)
    return {"cycles": schedule.scheduled, "overlap": schedule.overlap, "ddr": tdma_traffic(model)["total"],
            "vendor_cycles": schedule_model(model, VENDOR_COSTS).scheduled}  # fmt: skip


def _print_schedules(results: dict, live: dict) -> None:
    print(f"{'model':<14} {'chip':<7} {'cycles npuc':>12} {'tpu-mlir':>12} {'overlap npuc':>13} {'tpu-mlir':>9}"
          f" {'DDR npuc':>12} {'tpu-mlir':>12}")  # fmt: skip
    for (name, chip), r in results.items():
        if "error" in r:
            continue
        theirs = _tpu_mlir_schedule(name, chip, live)
        cycles, overlap, ddr = (
            (f"{theirs['cycles']:>12,}", f"{theirs['overlap']:>9.1%}", f"{theirs['ddr']:>12,}") if theirs else
            (f"{'-':>12}", f"{'-':>9}", f"{'-':>12}"))  # fmt: skip
        print(f"{name:<14} {chip:<7} {r['cycles']:>12,} {cycles} {r['overlap']:>13.1%} {overlap} {r['ddr']:>12,} {ddr}")
    print(
        "the same programs under the vendor's cost formulas (backends/cv18xx/vendor_cost.py), cycles npuc / tpu-mlir:"
    )
    for (name, chip), r in results.items():
        theirs = _tpu_mlir_schedule(name, chip, live) if "error" not in r else None
        if "error" not in r:
            vendor = f"{theirs['vendor_cycles']:>12,}" if theirs and "vendor_cycles" in theirs else f"{'-':>12}"
            print(f"{name:<14} {chip:<7} {r['vendor_cycles']:>12,} {vendor}")


def _print_rankings(results: dict) -> None:
    """Each build's candidate schedules priced by both cost models: the same cheapest, and the share of pairs
    both order the same way (the vendor simulator reports no timing, so the vendor's own formulas are the
    external check of the nominal model's choices)."""
    print("candidate schedules, cycles nominal / vendor formulas (rank under each):")
    for (name, chip), r in results.items():
        if "error" in r:
            continue
        found = r["candidates"]
        keys = list(found)
        pairs = [(a, b) for i, a in enumerate(keys) for b in keys[i + 1 :]]
        agree = sum((found[a][0] - found[b][0]) * (found[a][1] - found[b][1]) > 0 for a, b in pairs)
        ranks = [sorted(keys, key=lambda k, m=m: found[k][m]) for m in (0, 1)]
        cells = "  ".join(f"{k} {found[k][0]:,} ({ranks[0].index(k) + 1}) / {found[k][1]:,} ({ranks[1].index(k) + 1})"
                          for k in keys)  # fmt: skip
        same = "same cheapest" if ranks[0][0] == ranks[1][0] else "CHEAPEST DIFFERS"
        print(f"  {name:<14} {chip:<7} {cells}  -> {same}, {agree} of {len(pairs)} pairs ordered alike")


def _tpu_mlir_live(folder: Path, model: Path, chips: list[str]) -> dict:
    """With TPU_MLIR_VENV set: tpu-mlir's default int8 resnet18_224 for each chip, calibrated on the same
    photos ((name, chip) -> its cvimodel's bytes); else {} and the stored figures are printed."""
    import numpy as np
    import tpumlir

    if tpumlir.venv() is None:
        return {}
    feeds = [dict(np.load(p)) for p in sorted((folder / "samples").glob("*.npz"))]
    live = {}
    for chip in chips:
        try:
            built = tpumlir.build_int8(model, feeds, folder / f"tpumlir_{chip}", "resnet18_224", chip)[0]
            live["resnet18_224", chip] = built.read_bytes()
        except tpumlir.ToolFailed as failed:
            print(f"tpu-mlir resnet18_224 {chip}: {failed}")
    return live


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chips", default="cv183x,cv181x")
    parser.add_argument("--samples", type=int, default=4, help="calibration photos for resnet18_224 (max 7)")
    parser.add_argument("--child", nargs=4, metavar=("MODEL", "TABLE", "CHIP", "SHAPES"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        model, table, chip, shapes = args.child
        print(json.dumps(measure(Path(model), Path(table), chip, json.loads(shapes) or None)))
        return 0

    chips = args.chips.split(",")
    with tempfile.TemporaryDirectory(prefix="npuc-bench-cv18xx-") as tmp:
        start = time.perf_counter()
        resnet = _calibrate_resnet(Path(tmp), args.samples)
        print(f"resnet18_224 calibrated (KL) on {args.samples} photos in {time.perf_counter() - start:.1f} s")
        models = {"smallcnn": (GOLDEN / "smallcnn.onnx", GOLDEN / "smallcnn_cali_table.txt"), "resnet18_224": resnet}
        for name, real in REAL.items():
            start = time.perf_counter()
            models[name] = _calibrate_real(Path(tmp), args.samples, real)
            print(f"{name} calibrated (KL) on {args.samples} pictures in {time.perf_counter() - start:.1f} s")
        results = {
            (name, chip): _child(*paths[:2], chip, *paths[2:]) for name, paths in models.items() for chip in chips
        }
        live = _tpu_mlir_live(Path(tmp), resnet[0], chips)
    print(
        "build s: canonicalize + compile, in-process, ONNX import excluded (cold = first in process, warm = best"
        " of 2 more)\npeak MB: tracemalloc peak of one build / peak RSS of a pure compile (VmHWM, with imports)\n"
        "DDR: bytes the TDMA moves (from the cmdbuf bytes); LG = default options, noLG = layer_group False;"
        " bound = weights + TPU inputs + outputs once"
    )
    print(
        f"{'model':<14} {'chip':<7} {'cold s':>7} {'warm s':>7} {'trace MB':>8} {'RSS MB':>8} {'artifact B':>11}"
        f" {'gmem B':>10} {'DDR LG':>12} {'DDR noLG':>12} {'bound':>12} {'ratio':>6} {'overlap':>8} {'serial':>8}"
    )
    for (name, chip), r in results.items():
        print(_row(name, chip, r))
    memory = TPU_MLIR["shared"] + TPU_MLIR["private"]
    print(
        f"{'tpu-mlir':<14} {'':<7} {TPU_MLIR['build_s']:>7.2f} {'':>7} {'':>8} {'':>8} {TPU_MLIR['size']:>11,}"
        f" {memory:>10,}   (resnet18_224, pure compile; shared {TPU_MLIR['shared']:,} + private"
        f" {TPU_MLIR['private']:,})"
    )
    print("cycles / overlap: timing.schedule_model (nominal cost model); tpu-mlir's from its files"
          f"{' (resnet18_224 built live)' if live else ' or issue 23'}")  # fmt: skip
    _print_schedules(results, live)
    _print_rankings(results)
    print("goals against tpu-mlir:")
    for chip in chips:
        r = results[("resnet18_224", chip)]
        print(
            *(_goals(chip, r) if "error" not in r else [f"  resnet18_224 {chip}: not built ({r['error']})"]), sep="\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

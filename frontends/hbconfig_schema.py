"""Reading an hb_mapper YAML config safely: bounded size, bounded aliases, and a JSON Schema of its value types
and ranges (specs/dmp-lyngor-horizon.md §3.2), checked before `hbconfig.parse_config` uses a single value.

The schema holds what one key says on its own (type, allowed words, numeric range); `hbconfig.py` keeps the
checks that relate keys to each other or to the model (per-input `;` lists, march-dependent keys, layouts).
Keys whose value is text accept strings, numbers and null (YAML types `mean_value: 128` as a number) but never
a list or mapping, so nothing aliased reaches `str()`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from npuc.compiler.errors import UserError
from npuc.compiler.fileio import read_limited

# Horizon BPU architectures, as hb_mapper names them (its `march` key): X3/J3, J5, X5
MARCHES = ("bernoulli2", "bayes", "bayes-e")

MAX_CONFIG_BYTES = 1 << 20
MAX_ALIASES = 64  # a config has no reason for aliases at all; a handful is tolerated
MAX_CONFIG_VALUES = 100_000  # a config holds dozens of keys; a few KB of aliases can stand for billions
MAX_BATCH = 128
MAX_TIME_PER_FC_MIN, MAX_TIME_PER_FC_MAX = 1000, (1 << 32) - 1
COMPILE_MODES = ("latency", "bandwidth")
OPTIMIZE_LEVELS = ("O0", "O1", "O2", "O3")
CALIBRATION_TYPES = ("default", "mix", "kl", "max", "load", "skip")
CAL_DATA_TYPES = ("float32", "uint8")
INPUT_SOURCES = ("ddr", "pyramid", "resizer")
GROUPS = ("model_parameters", "input_parameters", "calibration_parameters", "compiler_parameters")

TEXT = {"type": ["string", "number", "null"]}
BOOL = {
    "description": "a boolean (True or False)",
    "anyOf": [{"type": "boolean"}, {"enum": ["True", "true", "False", "false"]}],
}


def words(*allowed: str) -> dict[str, Any]:
    """One of the allowed words, or empty (null / "") where the key is optional."""
    return {"enum": [*allowed, None, ""]}


def group(properties: dict[str, Any]) -> dict[str, Any]:
    """A group: a mapping (or empty); keys it does not list are any scalar (reported as ignored)."""
    return {"type": ["object", "null"], "properties": properties, "additionalProperties": TEXT_OR_ANY}


TEXT_OR_ANY = {"type": ["string", "number", "boolean", "null", "object", "array"]}

HB_CONFIG: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "hb_mapper YAML config",
    "type": "object",
    "properties": {
        "model_parameters": group(
            {
                **{k: TEXT for k in ("onnx_model", "caffe_model", "prototxt", "output_model_file_prefix")},
                **{k: TEXT for k in ("working_dir", "output_nodes", "remove_node_type", "remove_node_name")},
                "march": words(*MARCHES),
                "layer_out_dump": BOOL,
                "debug_mode": words("dump_calibration_data"),
                "node_info": {"type": ["object", "string", "null"]},
                "set_node_data_type": {"type": ["object", "string", "null"]},
            }
        ),
        "input_parameters": group(
            {
                **{
                    k: TEXT
                    for k in (
                        "input_name",
                        "input_type_train",
                        "input_layout_train",
                        "input_type_rt",
                        "input_layout_rt",
                        "input_space_and_range",
                        "input_shape",
                        "norm_type",
                        "mean_value",
                        "scale_value",
                    )
                },  # fmt: skip
                "input_batch": {"type": "integer", "minimum": 1, "maximum": MAX_BATCH},
            }
        ),
        "calibration_parameters": group(
            {
                "cal_data_dir": TEXT,
                "calibration_type": words(*CALIBRATION_TYPES),
                "max_percentile": {"type": "number", "minimum": 0, "maximum": 1},
                "cal_data_type": words(*CAL_DATA_TYPES),
                "preprocess_on": BOOL,
                "per_channel": BOOL,
                "optimization": TEXT,
                "run_on_cpu": TEXT,
                "run_on_bpu": TEXT,
            }
        ),
        "compiler_parameters": group(
            {
                "compile_mode": words(*COMPILE_MODES),
                "optimize_level": words(*OPTIMIZE_LEVELS),
                "debug": BOOL,
                "core_num": {"enum": [1, 2]},
                "input_source": {"type": "object", "additionalProperties": {"enum": list(INPUT_SOURCES)}},
                "max_time_per_fc": {
                    "description": "0 or an integer 1000..4294967295 (µs)",
                    "type": "integer",
                    "anyOf": [{"const": 0}, {"minimum": MAX_TIME_PER_FC_MIN, "maximum": MAX_TIME_PER_FC_MAX}],
                },
                "jobs": {"type": "integer", "minimum": 1},
            }
        ),
        "custom_op": group({"custom_op_method": words("register"), "op_register_files": TEXT, "custom_op_dir": TEXT}),
    },
    "required": list(GROUPS),
}


def _bounded_loader() -> type:
    """A SafeLoader that refuses more than MAX_ALIASES alias references while composing (before any
    structure is built), so an alias bomb costs nothing."""
    import yaml

    class BoundedLoader(yaml.SafeLoader):
        aliases = 0

        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.AliasEvent):
                self.aliases += 1
                if self.aliases > MAX_ALIASES:
                    problem = f"more than {MAX_ALIASES} aliases; a build config needs none"
                    raise yaml.composer.ComposerError(None, None, problem, self.peek_event().start_mark)
            return super().compose_node(parent, index)

    return BoundedLoader


def load_yaml(path: Path) -> Any:
    """The parsed YAML of a build config, or a one-line UserError (size, encoding, syntax, aliases)."""
    import yaml

    text = read_limited(path, "build config", MAX_CONFIG_BYTES)
    try:
        data = yaml.load(text.decode("utf-8"), Loader=_bounded_loader())  # noqa: S506 - a SafeLoader subclass
    except UnicodeDecodeError:
        raise UserError(f"{path}: not UTF-8 text; save the config as UTF-8 YAML") from None
    except yaml.reader.ReaderError as exc:  # a character YAML does not allow; str(exc) spans two lines
        line = text.decode("utf-8")[: max(exc.position, 0)].count("\n") + 1  # position: characters
        raise UserError(
            f"{path}: line {line}: invalid YAML (character #x{exc.character:04x} is not allowed in YAML text); "
            "fix the syntax"
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc) or type(exc).__name__
        raise UserError(f"{path}:{where}: invalid YAML ({problem}); fix the syntax") from None
    values = expanded_size(data)
    if values > MAX_CONFIG_VALUES:
        raise UserError(
            f"{path}: the YAML expands to {values:.3g} values through its aliases (at most {MAX_CONFIG_VALUES}); "
            "write the config without alias chains"
        )
    return data


def expanded_size(data: Any) -> int:
    """How many values `data` holds once its shared (aliased) containers are expanded, counted without
    expanding them: a post-order walk that sizes each container once and reuses it wherever an alias points."""
    sizes: dict[int, int] = {}
    stack: list[tuple[Any, bool]] = [(data, False)]
    while stack:
        item, children_done = stack.pop()
        if not isinstance(item, (dict, list)) or (id(item) in sizes and not children_done):
            continue
        children = list(item.values()) if isinstance(item, dict) else item
        if children_done:
            sizes[id(item)] = 1 + sum(sizes.get(id(c), 1) for c in children)
            continue
        sizes[id(item)] = 0  # in progress (YAML cannot make cycles through safe_load's plain containers)
        stack.append((item, True))
        stack.extend((c, False) for c in children if isinstance(c, (dict, list)) and id(c) not in sizes)
    return sizes.get(id(data), 1)

"""RL hyper-parameters and the dataset's rules from a TOML file and the command line (issue 15, items 4, 6).

`rpeg-run PLAN --backend torch --rl-config rl.toml --rl clip_eps=0.1 --rl ppo_epochs=2` sets fields of the
run's `RLConfig` (runtime/backends/torch/rl/step.py: learning rates, clip ranges, KL coefficient and estimator,
entropy bonus, gamma/lambda, PPO epochs and minibatches, Adam betas and eps, gradient clipping, sampling
temperature, top-p and top-k). The file's top-level keys are those names; its `[data]` table sets the
`DataConfig` of the prompt dataset
(runtime/backends/torch/rl/datasets.py: path, column keys, tokenizer, chat template, truncation, shuffle), and
`--rl data.NAME=VALUE` one of them. `--rl NAME=VALUE` (repeatable) overrides the file, `--data FILE` the
dataset's path, and `--lr` both learning rates last. Names, types and ranges are checked before anything
runs, with errors at the key's line in the file or at the option. The effective configs are recorded in the
trace header (`options.rl`, `options.data`) and, as part of the run identity, in every checkpoint. `rpeg-run
rl-settings` lists every setting (`settings_listing`).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import tomllib
import types
import typing
from typing import Any, Optional, Sequence

from rpegc.core.ir.algorithms import algorithm_family, algorithm_names
from rpegc.core.ir.errors import Loc, RpegError
from rpegc.core.ir.toml_text import decode_error_position, key_position
from rpegc.inputs import read_input_text
from rpegc.runtime.backends.torch.rl.datasets import DataConfig
from rpegc.core.ir.options import option_help
from rpegc.runtime.backends.torch.rl.bounds import BOUNDS, Bound, range_error
from rpegc.runtime.backends.torch.rl.step import RLConfig

# `algorithm = NAME` chooses another registered algorithm of the graph's family (a GRPO graph runs DAPO)
ALGORITHM = "algorithm"
DATA_PREFIX = "data."


@dataclasses.dataclass
class Settings:
    """What the user set: RLConfig fields and DataConfig fields, by name."""

    rl: dict[str, Any] = dataclasses.field(default_factory=dict)
    data: dict[str, Any] = dataclasses.field(default_factory=dict)


def settable(cls: type = RLConfig) -> dict[str, Any]:
    """name -> type of every field of `cls` (RLConfig or DataConfig) a user may set."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def settings_listing() -> str:
    """Every RL and data setting a user may set, with its type, default, range and meaning (`rpeg-run rl-settings`),
    read from the dataclasses and the bounds that declare them."""
    out = ["RL settings: --rl NAME=VALUE, or NAME = VALUE at the top of --rl-config's TOML file"]
    out += _listing(RLConfig, "")
    out += ["", f"data settings: --rl {DATA_PREFIX}NAME=VALUE, or NAME = VALUE in the TOML file's [data] table"]
    return "\n".join(out + _listing(DataConfig, DATA_PREFIX)) + "\n"


def _listing(cls: type, prefix: str) -> list[str]:
    types_of = settable(cls)
    lines = []
    for f in dataclasses.fields(cls):
        bound = BOUNDS.get(f.name) if cls is RLConfig else None
        limits = "" if bound is None else f"; {_range_text(bound)}"
        kind = TEMPLATE_KWARGS_TYPE if f.name == TEMPLATE_KWARGS else _type_name(types_of[f.name])
        lines.append(f"  {prefix}{f.name} = {_default_text(f.default)}  ({kind}{limits})")
        lines.append(f"      {option_help(f)}")
    return lines


def _default_text(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple):
        return json.dumps([list(v) if isinstance(v, tuple) else v for v in value])
    return json.dumps(value) if isinstance(value, str) else repr(value)


def _range_text(b: Bound) -> str:
    parts = [] if b.low is None else [f"{'>=' if b.low_allowed else '>'} {b.low:g}"]
    return " and ".join(parts + ([] if b.high is None else [f"<= {b.high:g}"]))


def _type_name(t: Any) -> str:
    if t is float:
        return "a number"
    if t is int:
        return "an integer"
    if t is bool:
        return "true or false"
    if t is str:
        return "a string"
    if typing.get_origin(t) is tuple:
        return f"a list of {len(typing.get_args(t))} numbers"
    args = [a for a in typing.get_args(t) if a is not type(None)]
    return f"{_type_name(args[0])} (or none)"


def coerce(name: str, value: Any, where: str, cls: type = RLConfig) -> Any:
    """`value` as the type of field `name` of `cls`, range-checked; a RpegError (located by the caller) if not."""
    fields = settable(cls)
    if name not in fields:
        close = difflib.get_close_matches(name, fields, n=1)
        hint = f"; did you mean {close[0]}?" if close else f"; known: {', '.join(sorted(fields))}"
        what = "RL setting" if cls is RLConfig else "data setting"
        raise RpegError(None, f"{where}: unknown {what} '{name}'{hint}")
    if name == TEMPLATE_KWARGS:
        return _template_kwargs(value, where)
    if name == ALGORITHM and cls is RLConfig:
        if not isinstance(value, str) or algorithm_family(value) is None:
            raise RpegError(None, f"{where}: unknown algorithm {value!r}; use one of {', '.join(algorithm_names())} "
                                  "(or one a plugin of the entry-point group rpegc.rl registers)")
        return value
    t = fields[name]
    optional = typing.get_origin(t) in (typing.Union, types.UnionType) and type(None) in typing.get_args(t)
    base = next((a for a in typing.get_args(t) if a is not type(None)), t) if optional else t
    if optional and (value is None or (isinstance(value, str) and value.lower() == "none")):
        return None
    try:
        out = _convert(base, value)
    except (TypeError, ValueError):
        raise RpegError(None, f"{where}: {name} must be {_type_name(t)}, got {value!r}") from None
    _check_range(name, out, where)
    return out


TEMPLATE_KWARGS = "chat_template_kwargs"
TEMPLATE_KWARGS_TYPE = "a table (TOML) or a JSON object (--rl) of names to values"


def _template_kwargs(value: Any, where: str) -> tuple[tuple[str, Any], ...]:
    """data.chat_template_kwargs: a table (TOML) or a JSON object (--rl) of names to true/false, numbers or strings,
    as sorted (name, value) pairs."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            value = None
    if not isinstance(value, dict) or not all(
            isinstance(k, str) and k.isidentifier() and isinstance(v, (bool, int, float, str)) for k, v in value.items()):
        raise RpegError(None, f"{where}: {TEMPLATE_KWARGS} must be a table of names to true/false, numbers or "
                              f"strings, e.g. {{enable_thinking = false}} (--rl 'data.{TEMPLATE_KWARGS}="
                              f"{{\"enable_thinking\": false}}'), got {value!r}")
    return tuple(sorted(value.items()))


def _convert(t: Any, value: Any) -> Any:
    if t is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise ValueError
    if t is int:
        if isinstance(value, bool) or not (isinstance(value, int) or (isinstance(value, str) and value.lstrip("-").isdigit())):
            raise ValueError
        return int(value)
    if t is float:
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ValueError
        x = float(value)
        if not math.isfinite(x):
            raise ValueError
        return x
    if t is str:
        if not isinstance(value, str):
            raise ValueError
        return value
    if typing.get_origin(t) is tuple:
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, (list, tuple)) or len(items) != len(typing.get_args(t)):
            raise ValueError
        return tuple(_convert(a, v) for a, v in zip(typing.get_args(t), items))
    raise TypeError


def _check_range(name: str, value: Any, where: str) -> None:
    error = range_error(name, value)
    if error is not None:
        raise RpegError(None, f"{where}: {error}")


MAX_RL_CONFIG_BYTES = 16 << 20  # a flat table of a few dozen settings


def read_rl_file(path: str) -> Settings:
    """The settings of a TOML file, checked; errors at the key's line."""
    text = read_input_text(path, "the RL config", MAX_RL_CONFIG_BYTES)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        line, col = decode_error_position(e)
        raise RpegError(Loc(path, line or 1, col or 1), f"the RL config is not valid TOML: {str(e).split(' (at')[0]}",
                        source=text) from None
    out = Settings()
    for name, value in data.items():
        line, col = key_position(text, name)
        try:
            if isinstance(value, dict) and name == "data":
                out.data = {k: coerce(k, v, f"{path}: [data]", DataConfig) for k, v in value.items()}
            elif isinstance(value, dict):
                raise RpegError(None, f"{path}: [{name}] is not a table the RL config has; it holds RL settings "
                                "at the top and the dataset's in [data]")
            else:
                out.rl[name] = coerce(name, value, path)
        except RpegError as e:
            raise RpegError(Loc(path, line or 1, col or 1), e.message.removeprefix(f"{path}: "), source=text) from None
    return out


def parse_overrides(pairs: Sequence[str]) -> Settings:
    """`--rl NAME=VALUE` options, checked (VALUE: a number, true/false, none, a string, or a,b for a pair);
    `data.NAME=VALUE` sets the dataset's NAME."""
    out = Settings()
    for pair in pairs:
        name, sep, value = pair.partition("=")
        name = name.strip()
        if not sep or not name:
            raise RpegError(None, f"--rl {pair}: give NAME=VALUE, e.g. --rl clip_eps=0.1")
        if name.startswith(DATA_PREFIX):
            key = name[len(DATA_PREFIX):]
            out.data[key] = coerce(key, value.strip(), f"--rl {pair}", DataConfig)
        else:
            out.rl[name] = coerce(name, value.strip(), f"--rl {pair}")
    return out


def rl_settings(config_file: Optional[str], pairs: Sequence[str], lr: Optional[float],
                data_path: Optional[str] = None) -> Settings:
    """The overrides of the run's RL and data configs: the file's, then the --rl options', then --lr and
    --data."""
    settings = read_rl_file(config_file) if config_file else Settings()
    overrides = parse_overrides(pairs)
    settings.rl.update(overrides.rl)
    settings.data.update(overrides.data)
    if lr is not None:
        settings.rl.update(lr_actor=lr, lr_critic=lr)
    if data_path is not None:
        settings.data["path"] = data_path
    return settings

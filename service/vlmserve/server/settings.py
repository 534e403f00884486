"""Settings declared once: a field of a pydantic model is the whole declaration.

Its type, default, bounds and help text (`description`) are written there and nowhere else;
from that one declaration come:

* the environment variable: the model's `ENV_PREFIX` (a class variable) + the field name
  upper-cased (`VLMSERVE_FACADE_MAX_TOOLS`);
* the command-line flag: `--` + the field name with dashes (`--max-tools`), with help text that
  shows the default and the variable;
* the value: default < environment < command line, checked by the model's own validation, and a
  bad value is an error that names the flag or variable it came from.

Fields whose type is itself a model are flattened (their fields get flags and variables of their
own, grouped under that model's docstring in `--help`), so code can keep `settings.limits.x`.
`Option(...)` in a field's `Annotated[...]` keeps an older flag or variable name, or leaves a
secret off the command line. A field typed `tuple[...]` takes a comma-separated variable and a
repeatable flag; `bool` takes `--x` / `--no-x` and 1/0, true/false, yes/no, on/off; `X | None`
takes `none`.

Adding a setting is adding a field (with `description=`); see docs/configuration.md.

Only the engine and the facade import this module (pydantic is in their extras, not in the base
install of the client library). pydantic-settings was the first choice, but its command line
names nested fields `--limits.max-request-bytes`, its environment wants `..._LIMITS__...`, and its
models read the process environment whenever they are built (tests build them directly): this
module is the small part of it we need, with the flat names our users already have.
"""

from __future__ import annotations

import argparse
import os
import types
import typing
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Self, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic.fields import FieldInfo

__all__ = [
    "DeclaredSettings",
    "Option",
    "Setting",
    "SettingsError",
    "add_arguments",
    "declared",
    "load",
    "reference",
    "to_argv",
]

_Model = TypeVar("_Model", bound=BaseModel)


@dataclass(frozen=True, slots=True)
class Option:
    """Names of a setting where they are not derived from the field name.

    `flag`: the command-line flag; None leaves the setting off the command line (secrets: `ps`
    shows every process's arguments). `env`: the full variable name. `aliases`: older flags that
    still work.
    """

    flag: str | None = ""
    env: str = ""
    aliases: tuple[str, ...] = ()
    metavar: str | None = None
    # How help and docs show a default that depends on the machine (a path in the checkout).
    default_text: str | None = None


class SettingsError(ValueError):
    """A setting's value is invalid; the message names the flag or variable it came from."""


@dataclass(frozen=True, slots=True)
class Setting:
    """One declared setting, as found in a model (nested models flattened)."""

    path: tuple[str, ...]
    info: FieldInfo
    flag: str | None
    aliases: tuple[str, ...]
    env: str
    metavar: str | None
    group: str | None
    default_text: str | None

    @property
    def dest(self) -> str:
        return ".".join(self.path)

    @property
    def is_bool(self) -> bool:
        return _strip_optional(self.info.annotation) is bool

    @property
    def is_sequence(self) -> bool:
        return typing.get_origin(_strip_optional(self.info.annotation)) in (tuple, list)

    @property
    def int_choices(self) -> bool:
        """A `Literal` of ints (`--kv-bits {4,8}`): text from a flag or variable is read as an int."""
        kind = _strip_optional(self.info.annotation)
        choices = typing.get_args(kind) if typing.get_origin(kind) is typing.Literal else ()
        return bool(choices) and all(type(choice) is int for choice in choices)

    @property
    def allows_none(self) -> bool:
        return type(None) in typing.get_args(self.info.annotation)

    def names(self) -> str:
        return " / ".join(name for name in (self.flag, self.env) if name)


def _strip_optional(annotation: Any) -> Any:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


def _nested_model(annotation: Any) -> type[BaseModel] | None:
    annotation = _strip_optional(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


class DeclaredSettings(BaseModel):
    """Base of a settings model: frozen; `ENV_PREFIX` and `FLAG_PREFIX` name its variables and
    flags (a nested model without its own uses its parent's)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    ENV_PREFIX: ClassVar[str] = ""
    FLAG_PREFIX: ClassVar[str] = ""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Self:
        """Declared defaults overridden by the environment (`os.environ` unless given)."""
        return load(cls, environ=os.environ if environ is None else environ)

    def replace(self, **changes: Any) -> Self:
        """A copy with `changes`, validated like the original."""
        return self.model_validate({**dict(self), **changes})


def declared(model: type[BaseModel]) -> list[Setting]:
    """Every setting of `model`, nested models flattened, in declaration order."""
    return list(_walk(model, (), "", "", None))


def _walk(
    model: type[BaseModel], path: tuple[str, ...], env_prefix: str, flag_prefix: str, group: str | None
) -> Iterator[Setting]:
    env_prefix = model.__dict__.get("ENV_PREFIX", env_prefix)
    flag_prefix = model.__dict__.get("FLAG_PREFIX", flag_prefix)
    for name, info in model.model_fields.items():
        nested = _nested_model(info.annotation)
        if nested is not None:
            title = " ".join((nested.__doc__ or nested.__name__).strip().split("\n\n")[0].split())
            yield from _walk(nested, (*path, name), env_prefix, flag_prefix, title)
            continue
        option = next((meta for meta in info.metadata if isinstance(meta, Option)), Option())
        if not info.description:
            raise TypeError(f"setting {'.'.join((*path, name))} needs a description (its help text)")
        flag = "--" + (flag_prefix + name).replace("_", "-") if option.flag == "" else option.flag
        yield Setting(
            path=(*path, name),
            info=info,
            flag=flag,
            aliases=option.aliases,
            env=option.env or env_prefix + name.upper(),
            metavar=option.metavar,
            group=group,
            default_text=option.default_text,
        )


def _show(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, tuple | list):
        return ",".join(map(str, value)) or "none"
    return str(value)


def add_arguments(parser: argparse.ArgumentParser, model: type[BaseModel]) -> list[Setting]:
    """Add a flag for every setting of `model` (none of them with a default: absent flags leave
    the environment's or the declared value in force). Settings without a flag are listed in the
    parser's epilog with their variables."""
    settings = declared(model)
    groups: dict[str | None, Any] = {None: parser}
    hidden: list[str] = []
    for setting in settings:
        described = f"{setting.info.description} (default: {_shown_default(setting)}; ${setting.env})"
        help_text = described.replace("%", "%%")  # argparse formats help with %
        if setting.flag is None:
            hidden.append(f"${setting.env}: {setting.info.description}")
            continue
        if setting.group not in groups:
            groups[setting.group] = parser.add_argument_group(setting.group)
        kwargs: dict[str, Any] = {"dest": setting.dest, "default": argparse.SUPPRESS, "help": help_text}
        if setting.is_bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kwargs["metavar"] = setting.metavar or _metavar(setting)
            if setting.is_sequence:
                kwargs["action"] = "append"
                kwargs["help"] += "; repeat for more"
        groups[setting.group].add_argument(setting.flag, *setting.aliases, **kwargs)
    if hidden:
        epilog = "Environment only (secrets are never taken from the command line): " + "; ".join(hidden)
        parser.epilog = f"{parser.epilog}\n{epilog}" if parser.epilog else epilog
    return settings


def _metavar(setting: Setting) -> str:
    kind = _strip_optional(setting.info.annotation)
    if typing.get_origin(kind) is typing.Literal:
        return "{" + ",".join(map(str, typing.get_args(kind))) + "}"
    if setting.is_sequence:
        kind = typing.get_args(kind)[0]
    names = {int: "N", float: "NUMBER", Path: "PATH"}
    return names.get(kind, "TEXT") if isinstance(kind, type) else "VALUE"


def _shown_default(setting: Setting) -> str:
    if setting.default_text is not None:
        return setting.default_text
    return _show(setting.info.get_default(call_default_factory=True))


def _set(tree: dict[str, Any], path: Sequence[str], value: Any) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


def _from_text(setting: Setting, raw: str) -> Any:
    if setting.allows_none and raw.strip().lower() == "none":
        return None
    if setting.is_sequence:
        return [item.strip() for item in raw.split(",") if item.strip()]
    if setting.int_choices and raw.strip().lstrip("-").isdigit():
        return int(raw)  # pydantic matches `Literal[4, 8]` to ints only, never to the text "8"
    return raw


def load(
    model: type[_Model],
    *,
    environ: Mapping[str, str],
    args: argparse.Namespace | None = None,
) -> _Model:
    """`model` from its declared defaults, then `environ`, then `args` (parsed by a parser that
    `add_arguments` filled). Raises SettingsError naming the flag or variable of a bad value."""
    values: dict[str, Any] = {}
    origin: dict[tuple[str, ...], str] = {}
    for setting in declared(model):
        raw = environ.get(setting.env)
        if raw is not None and raw != "":
            _set(values, setting.path, _from_text(setting, raw))
            origin[setting.path] = f"${setting.env}"
        if args is not None and hasattr(args, setting.dest):
            value = getattr(args, setting.dest)
            if isinstance(value, str):
                value = _from_text(setting, value)
            elif isinstance(value, list):
                value = [item for text in value for item in _from_text(setting, text)]
            _set(values, setting.path, value)
            origin[setting.path] = str(setting.flag)
    try:
        return model.model_validate(values)
    except ValidationError as error:
        raise SettingsError(_explain(error, origin)) from None


def _explain(error: ValidationError, origin: Mapping[tuple[str, ...], str]) -> str:
    problems = []
    for problem in error.errors(include_url=False):
        loc = tuple(str(part) for part in problem["loc"])
        source = next((name for path, name in origin.items() if loc[: len(path)] == path), None)
        where = source or ".".join(loc) or "settings"
        problems.append(f"{where}: {problem['msg']}")
    return "; ".join(problems)


def to_argv(model: type[BaseModel], args: argparse.Namespace, *, under: str) -> list[str]:
    """The flags of the settings below `model`'s field `under` that `args` holds, as a command
    line (for a launcher that passes them on to the program that declares them)."""
    argv: list[str] = []
    for setting in declared(model):
        if setting.path[0] != under or setting.flag is None or not hasattr(args, setting.dest):
            continue
        value = getattr(args, setting.dest)
        if setting.is_bool:
            argv.append(setting.flag if value else "--no-" + setting.flag[2:])
        elif isinstance(value, list):
            for item in value:
                argv += [setting.flag, str(item)]
        else:
            argv += [setting.flag, str(value)]
    return argv


def reference(model: type[BaseModel], *, without: tuple[str, ...] = ()) -> list[str]:
    """A Markdown table of `model`'s settings (less the fields named in `without`): flag,
    variable, default, meaning. docs/configuration.md holds these (scripts/settings_reference.py)."""
    lines = ["| flag | environment variable | default | meaning |", "| --- | --- | --- | --- |"]
    for setting in declared(model):
        if setting.path[0] in without:
            continue
        flag = f"`{setting.flag}`" if setting.flag else "(none: secret)"
        default = _shown_default(setting).replace("|", "\\|")
        lines.append(f"| {flag} | `{setting.env}` | `{default}` | {setting.info.description} |")
    return lines

"""The flags of the service's settings, made from the settings model: one declaration per setting.

A `Settings` field (h3core/runtime/settings.py) gives its flag everything: the name (`--` and the
field's name with dashes), the variable (`H3_` and the name in capitals), the type the command line
reads and the help (the field's description, with the field's default in brackets). `serve` takes
every setting but the `NoFlag` secrets, `worker` a few; each flag is unset unless given, so that
the environment and the TOML file keep their say below it.
"""

from __future__ import annotations

import functools
import inspect
import os
import types
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, TypeVar, Union, get_args, get_origin

import typer
from pydantic.fields import FieldInfo

from h3core.runtime.settings import NoFlag, Settings

__all__ = ["flag_help", "settings_flags"]

GIVEN = "given"  # the decorated command's parameter that receives the settings given as flags
CONFIG_HELP = "A TOML settings file (same names as these options)."

Command = TypeVar("Command", bound=Callable[..., Any])


def settings_flags(*names: str, help: Mapping[str, str] | None = None) -> Callable[[Command], Command]:
    """Give a typer command one flag per named setting (none named: every one but the `NoFlag`
    secrets), in the model's order after the command's own parameters, and `--config FILE`.

    The command declares a parameter `given: dict[str, Any]` in place of the flags: it receives the
    settings given on the command line or in their variables, by name, for `Settings(**given)`.
    `--config` sets `H3_CONFIG`, where the TOML source reads it. `help` replaces a flag's text where
    the command says more than the field (the default is still added from the field).
    """
    fields = Settings.model_fields
    chosen = names or tuple(name for name, field in fields.items() if NoFlag not in field.metadata)
    unknown = [name for name in chosen if name not in fields]
    if unknown:
        raise ValueError(f"no setting(s) {unknown}")
    texts = dict(help or {})

    def decorate(command: Command) -> Command:
        own = inspect.signature(command, eval_str=True)
        if GIVEN not in own.parameters:
            raise TypeError(f"{command.__name__} takes no `{GIVEN}` parameter for its settings")
        flags = [_flag(name, fields[name], texts.get(name)) for name in chosen]
        config = _option("config", Path, "H3_CONFIG", texts.get("config", CONFIG_HELP))
        params = [p for p in own.parameters.values() if p.name != GIVEN] + flags + [config]

        @functools.wraps(command)
        def run(**kwargs: Any) -> Any:
            path = kwargs.pop("config")
            if path is not None:
                os.environ["H3_CONFIG"] = str(path)  # in the environment, children of the process read it too
            given = {name: value for name in chosen if (value := kwargs.pop(name)) is not None}
            return command(**kwargs, **{GIVEN: given})

        # typer reads the parameters from the signature and resolves their types from the annotations.
        run.__signature__ = own.replace(parameters=params)  # type: ignore[attr-defined]
        run.__annotations__ = {p.name: p.annotation for p in params} | {"return": own.return_annotation}
        return run  # type: ignore[return-value]

    return decorate


def flag_help(field: FieldInfo, text: str | None = None) -> str:
    """A setting's help: its description (or `text`) with the default in brackets before the last
    full stop, where the default is a value; a default of None or empty says itself in the text."""
    text = text or field.description
    if not text:
        raise ValueError("a setting with a flag needs a description: it is the flag's help")
    default = _shown(field.default)
    if default is not None:
        body, stop, _ = text.rpartition(".") if text.endswith(".") else (text, "", "")
        text = f"{body} [{default}]{stop}"
    return text.replace("[", "\\[")  # rich markup: the brackets are text, not a style


def _shown(default: Any) -> str | None:
    if default is None or default == [] or default == {}:
        return None
    if isinstance(default, list):
        return ",".join(str(v) for v in default)  # as the flag takes it: comma-separated
    if isinstance(default, float) and default.is_integer():
        return str(int(default))
    return str(default)


def _flag(name: str, field: FieldInfo, text: str | None) -> inspect.Parameter:
    envvar = f"{Settings.model_config.get('env_prefix', '')}{name.upper()}"  # as the environment source reads it
    return _option(name, _read_as(field.annotation), envvar, flag_help(field, text))


def _option(name: str, kind: type, envvar: str, text: str) -> inspect.Parameter:
    option = typer.Option(envvar=envvar, help=text, show_default=False)
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Annotated[kind | None, option])


def _read_as(annotation: Any) -> type:
    """What the command line reads a setting as: a number or a path as itself, anything else as the
    text pydantic parses (a Literal's value, a comma-separated list, `size=tokens` pairs, a URL)."""
    union = get_origin(annotation) in (Union, types.UnionType)
    kinds = [a for a in (get_args(annotation) if union else (annotation,)) if a is not type(None)]
    return kinds[0] if len(kinds) == 1 and kinds[0] in (int, float, Path) else str

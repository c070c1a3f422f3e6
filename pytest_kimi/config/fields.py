"""Field types of the cluster file: strict pydantic types with the project's error wording.

Each type carries its own check so the message names the problem in the file's terms
("expected a port 1-65535 or 'auto'"), and its JSON Schema says what the check allows.
Nothing is coerced: ``"8"`` is not 8 and ``true`` is not 1.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Discriminator,
    Field,
    StringConstraints,
    Tag,
    WithJsonSchema,
)

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
FLAG = re.compile(r"^[a-z0-9][a-z0-9-]*$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
APIS = ("generate", "completions", "chat")
CLOCK_STARTS = ("request", "send")  # where TTFT and E2E start (workload.clock_start)
AUTO = "auto"


def kind(value: Any) -> str:
    """How a wrong value is shown: its YAML-ish type and repr (``str '8'``, ``bool True``)."""
    if value is None:
        return "nothing"
    return f"{type(value).__name__} {value!r}"


def _is_number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float)


def matching(pattern: re.Pattern[str], problem: Callable[[str], str]) -> Any:
    """A string that must match ``pattern``; ``problem(value)`` says why it does not."""

    def check(value: str) -> str:
        if not pattern.fullmatch(value):
            raise ValueError(problem(value))
        return value

    return Annotated[
        str, AfterValidator(check), WithJsonSchema({"type": "string", "pattern": pattern.pattern})
    ]


def one_of(*choices: str) -> Any:
    """One of a few words; the message lists them."""

    def check(value: Any) -> Any:
        if not isinstance(value, str) or value not in choices:
            raise ValueError(f"{value!r} is not one of {', '.join(choices)}")
        return value

    return Annotated[Literal[choices], BeforeValidator(check)]


Text = Annotated[str, StringConstraints(min_length=1)]
NodeName = matching(NAME, lambda v: f"{v!r} is not a plain name (letters, digits, . _ -)")
LayoutName = matching(NAME, lambda v: "layout names are plain words (letters, digits, . _ -)")
EnvName = matching(ENV_NAME, lambda v: "not a valid environment variable name")
SecretName = matching(ENV_NAME, lambda v: "the NAME of an environment variable, not a passphrase")
FlagName = matching(FLAG, lambda v: "flag names are lowercase words joined by '-'")
Count = Annotated[int, Field(ge=1)]
NonNegative = Annotated[int, Field(ge=0)]
Seconds = Annotated[float, Field(gt=0)]


def _text_value(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(f"expected a string, got {kind(value)}")
    return str(value)


# A string value that YAML may have read as a number (``NCCL_IB_DISABLE: 0``, ``e2e: 1500``).
TextValue = Annotated[
    str, BeforeValidator(_text_value), WithJsonSchema({"type": ["string", "number"]})
]


def _flag_value(value: Any) -> Any:
    if not isinstance(value, str | int | float | bool):
        raise ValueError(f"expected a scalar value, got {kind(value)}")
    return value


FlagValue = Annotated[str | int | float | bool, BeforeValidator(_flag_value)]
Env = dict[EnvName, TextValue]
Flags = dict[FlagName, FlagValue]
# a layout's flags over the server's: a value of null removes the server's flag
FlagChanges = dict[FlagName, FlagValue | None]


def _port(value: Any) -> Any:
    if value == AUTO and isinstance(value, str):
        return value
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise ValueError(f"expected a port 1-65535 or 'auto', got {value!r}")
    return value


Port = Annotated[Annotated[int, Field(ge=1, le=65535)] | Literal["auto"], BeforeValidator(_port)]


def _argv(value: Any) -> Any:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ValueError("expected a list of command-line words, e.g. [docker, exec, c]")
    return value


Argv = Annotated[list[Text], BeforeValidator(_argv)]


def _shell_lines(value: Any) -> Any:
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise ValueError("expected a list of shell lines, e.g. ['source /opt/venv/bin/activate']")
    return value


ShellLines = Annotated[list[Text], BeforeValidator(_shell_lines)]


def _env_names(value: Any) -> Any:
    if not isinstance(value, list):
        raise ValueError("expected a list of environment variable NAMES, e.g. [HF_TOKEN]")
    for item in value:
        if not isinstance(item, str) or not ENV_NAME.fullmatch(item):
            raise ValueError(f"{item!r} is not an environment variable name (a NAME, not a value)")
    if len(set(value)) != len(value):
        raise ValueError("a name is listed twice")
    return value


EnvNames = Annotated[list[str], BeforeValidator(_env_names)]
MOUNT = re.compile(r"^[^:\s]+:[^:\s]+(:ro|:rw)?$")
Mount = matching(MOUNT, lambda v: f"{v!r} is not SRC:DST or SRC:DST:ro")


def _gpu_selection(value: Any) -> Any:
    if isinstance(value, str) and value in ("all", "none"):
        return value
    if (
        isinstance(value, list)
        and value
        and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in value)
    ):
        return value
    raise ValueError(f"expected 'all', 'none' or a list of GPU indexes, got {value!r}")


GpuSelection = Annotated[
    Literal["all", "none"] | list[Annotated[int, Field(ge=0)]], BeforeValidator(_gpu_selection)
]


def _request_rate(value: Any) -> Any:
    if value == "inf" and isinstance(value, str):
        return value
    if not _is_number(value) or not value > 0:
        raise ValueError(f"expected requests/s > 0 or 'inf', got {value!r}")
    return value


RequestRate = Annotated[
    Annotated[float, Field(gt=0)] | Literal["inf"], BeforeValidator(_request_rate)
]


def _percentiles(value: Any) -> Any:
    if not isinstance(value, list) or not value:
        raise ValueError("expected a list of percentiles, e.g. [50, 90, 95, 99]")
    for item in value:
        if not _is_number(item) or not 0 < item <= 100:
            raise ValueError(f"{item!r} is not a percentile in (0, 100]")
    return value


Percentiles = Annotated[
    list[Annotated[float, Field(gt=0, le=100)]],
    Field(min_length=1),
    BeforeValidator(_percentiles),
]


def _nodes(value: Any) -> Any:
    if not isinstance(value, list) or not value:
        raise ValueError("expected a non-empty list of nodes")
    return value


def _layouts(value: Any) -> Any:
    if isinstance(value, dict) and not value:
        raise ValueError("define at least one layout")
    return value


NodeList = BeforeValidator(_nodes)
LayoutMap = BeforeValidator(_layouts)


ONE_VALUE, VALUES = "(one value)", "(values)"
"""The two shapes of a :data:`Sweep`; error locations leave them out (:mod:`.errors`)."""


def _sweep_shape(value: Any) -> str:
    return VALUES if isinstance(value, list) else ONE_VALUE


T = TypeVar("T")
Sweep = Annotated[
    Annotated[T, Tag(ONE_VALUE)] | Annotated[list[T], Field(min_length=1), Tag(VALUES)],
    Discriminator(_sweep_shape),
]
"""A workload setting: one value, or a non-empty list of values to sweep (one workload point
each, :mod:`pytest_kimi.config.points`). The shape is chosen by the value, so an error is about the
shape the file used."""

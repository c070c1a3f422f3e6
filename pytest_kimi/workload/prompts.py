"""How a row's first turn becomes the text sent: as is (``raw``) or in the model's chat template.

Why: SGLang's own SPEED-Bench loader (``sglang/benchmark/datasets/speed_bench.py``, newer than
0.5.9) wraps the first turn as ``[{"role": "user", "content": turn}]``, applies the served
model's chat template with ``add_generation_prompt=True`` and sends the decoded text. Sending the
raw turn instead gives a different input token count on the same rows, so our numbers would not
match SGLang's tool. Both constructions are offered, and the manifest says which one ran.

The template is rendered with jinja2 the way ``transformers`` renders chat templates (sandboxed,
``trim_blocks``/``lstrip_blocks``, ``loopcontrols``, ``tojson``, ``raise_exception``,
``strftime_now``, the tokenizer's special tokens as variables), so no ``transformers`` install
is needed. SGLang tokenizes the rendered text and decodes it again; for the lossless tokenizers
served models use, that round trip returns the rendered text, so we send the rendered text.

The chat API (``api: chat``) sends the messages as they are: the server applies its own
template, so none is applied here.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from pytest_kimi.workload.rows import DatasetError

RAW = "raw"
CHAT_TEMPLATE = "chat_template"
CHAT_TEMPLATE_OR_RAW = "chat_template_or_raw"
PROMPT_MODES: tuple[str, ...] = (RAW, CHAT_TEMPLATE, CHAT_TEMPLATE_OR_RAW)
"""``raw``: the first turn as is (the default, what earlier runs sent). ``chat_template``: the
first turn in the served model's chat template; a tokenizer without one is an error.
``chat_template_or_raw``: the same, but a tokenizer without a template falls back to ``raw``
(recorded in the manifest)."""

TEMPLATE_FILES: tuple[str, ...] = ("chat_template.jinja", "chat_template.json")
"""Files newer ``transformers`` save the template to; they take precedence over the
``chat_template`` key of ``tokenizer_config.json``, as in ``transformers``."""

_SPECIAL_TOKENS = (
    "bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token",
)  # fmt: skip


class PromptError(DatasetError):
    """The prompt construction asked for cannot be done (no template, a broken template)."""


@dataclass(frozen=True)
class ChatTemplate:
    """A tokenizer's chat template and the special tokens its text may refer to."""

    source: Path
    """The file the template was read from."""
    text: str
    special_tokens: dict[str, str]

    @property
    def sha256(self) -> str:
        """Fingerprint of the template text, for the manifest."""
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()

    def render_first_turn(self, turn: str) -> str:
        """The text SGLang's loader would send for this turn: one user message in the template,
        with the generation prompt appended."""
        return self.render([{"role": "user", "content": turn}])

    def render(self, messages: list[dict[str, str]]) -> str:
        """A conversation in the template, with the generation prompt appended: what SGLang's
        chat API would tokenize for the same messages."""
        from jinja2.exceptions import TemplateError

        try:
            return _compiled(self.text).render(
                messages=messages, add_generation_prompt=True, **self.special_tokens
            )
        except TemplateError as exc:
            raise PromptError(f"{self.source}: chat template failed to render: {exc}") from None


@dataclass(frozen=True)
class PromptConstruction:
    """What was asked for and what was done, for the manifest."""

    requested: str
    applied: str  # raw | chat_template | server_chat_template (chat API)
    tokenizer_dir: str | None = None
    template_file: str | None = None
    template_sha256: str | None = None
    note: str | None = None

    def manifest(self) -> dict[str, Any]:
        return {
            "requested": self.requested,
            "applied": self.applied,
            "tokenizer_dir": self.tokenizer_dir,
            "template_file": self.template_file,
            "template_sha256": self.template_sha256,
            "note": self.note,
        }


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PromptError(f"{path}: cannot read tokenizer file: {exc}") from None
    if not isinstance(data, dict):
        raise PromptError(f"{path}: expected a JSON object")
    return data


def _template_text(value: object, path: Path) -> str | None:
    """``chat_template`` is a string, or a list of ``{"name", "template"}`` (use ``default``)."""
    if value is None:
        return None
    if isinstance(value, str):
        return value or None
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        if isinstance(named.get("default"), str):
            return named["default"]
        raise PromptError(
            f"{path}: field 'chat_template': a list of named templates without 'default' "
            f"(names: {', '.join(str(n) for n in named)})"
        )
    raise PromptError(f"{path}: field 'chat_template': expected a string or a list of templates")


def _special_tokens(config: dict[str, Any]) -> dict[str, str]:
    """Special tokens as template variables: plain strings or ``{"content": ...}`` objects."""
    out: dict[str, str] = {}
    for name in _SPECIAL_TOKENS:
        value = config.get(name)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            out[name] = value
    return out


def load_chat_template(tokenizer_dir: Path) -> ChatTemplate | None:
    """The chat template of a tokenizer directory, or None when it has none.

    Looked for in ``chat_template.jinja``, ``chat_template.json`` and then the ``chat_template``
    key of ``tokenizer_config.json``. A missing directory or ``tokenizer_config.json`` is an
    error (the user named a tokenizer that is not there), a missing template is not (the caller
    decides whether to fall back).
    """
    tokenizer_dir = Path(tokenizer_dir)
    config_file = tokenizer_dir / "tokenizer_config.json"
    if not tokenizer_dir.is_dir():
        raise PromptError(
            f"{tokenizer_dir}: tokenizer directory not found on this machine (for the chat "
            "template: pass --kimi-tokenizer DIR with a local copy of the served model's "
            "tokenizer files)"
        )
    if not config_file.is_file():
        raise PromptError(f"{config_file}: not found (not a Hugging Face tokenizer directory?)")
    config = _read_json(config_file)
    tokens = _special_tokens(config)
    jinja_file, json_file = (tokenizer_dir / name for name in TEMPLATE_FILES)
    if jinja_file.is_file():
        return ChatTemplate(jinja_file, jinja_file.read_text(encoding="utf-8"), tokens)
    if json_file.is_file():
        text = _template_text(_read_json(json_file).get("chat_template"), json_file)
        if text is not None:
            return ChatTemplate(json_file, text, tokens)
    text = _template_text(config.get("chat_template"), config_file)
    return ChatTemplate(config_file, text, tokens) if text is not None else None


def _compiled(text: str) -> Any:
    """Compile a template in the environment ``transformers`` uses for chat templates."""
    from jinja2.exceptions import TemplateError
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    def tojson(value: Any, ensure_ascii: bool = False, indent: Any = None, **kw: Any) -> str:
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, **kw)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(text)


def construct(
    turns: list[str], mode: str, api: str, tokenizer_dir: Path | None
) -> tuple[list[str], PromptConstruction]:
    """The texts to send for these first turns, and what was done to them.

    ``raw`` and the chat API leave the turns as they are. Otherwise the template of
    ``tokenizer_dir`` is applied; a tokenizer without one is a :class:`PromptError` for
    ``chat_template`` and a recorded fall back to raw for ``chat_template_or_raw``.
    """
    if mode not in PROMPT_MODES:
        raise PromptError(f"prompt construction {mode!r} is not one of {', '.join(PROMPT_MODES)}")
    if mode == RAW:
        return list(turns), PromptConstruction(mode, RAW)
    where = str(tokenizer_dir) if tokenizer_dir is not None else None
    if api == "chat":
        note = "chat API: the messages are sent as they are; the server applies its template"
        return list(turns), PromptConstruction(mode, "server_chat_template", where, note=note)
    if tokenizer_dir is None:
        raise PromptError(
            f"prompt: {mode} needs the served model's tokenizer directory on this machine "
            "(pass --kimi-tokenizer DIR)"
        )
    template = load_chat_template(tokenizer_dir)
    if template is None:
        missing = (
            f"{tokenizer_dir}: the tokenizer has no chat template (no chat_template in "
            f"tokenizer_config.json, no {' or '.join(TEMPLATE_FILES)})"
        )
        if mode == CHAT_TEMPLATE:
            raise PromptError(
                f"{missing}; use prompt: raw, or prompt: {CHAT_TEMPLATE_OR_RAW} to fall back "
                "to raw turns"
            )
        return list(turns), PromptConstruction(mode, RAW, where, note=f"fell back: {missing}")
    texts = [template.render_first_turn(turn) for turn in turns]
    return texts, PromptConstruction(
        mode, CHAT_TEMPLATE, where, str(template.source), template.sha256
    )

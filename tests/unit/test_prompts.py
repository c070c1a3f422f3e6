"""Prompt construction: raw turns, or the served model's chat template as SGLang's loader does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_kimi.mock.tokenizer_files import TOKENIZER_DIR
from pytest_kimi.workload.dataset import load_workload
from pytest_kimi.workload.prompts import PromptError, construct, load_chat_template

LLAMA_LIKE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] | trim }}<|end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def tokenizer(tmp_path: Path, template: object = LLAMA_LIKE, **extra: object) -> Path:
    folder = tmp_path / "tok"
    folder.mkdir(exist_ok=True)
    config: dict[str, object] = {"bos_token": {"content": "<s>"}, "eos_token": "</s>", **extra}
    if template is not None:
        config["chat_template"] = template
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture
def rows_file(tmp_path: Path) -> Path:
    path = tmp_path / "rows.jsonl"
    lines = [
        {"question_id": f"q{i}", "category": "mixed", "turns": [f" turn {i} "]} for i in range(4)
    ]
    path.write_text("\n".join(json.dumps(r) for r in lines) + "\n")
    return path


def test_raw_sends_turns_as_they_are(rows_file: Path) -> None:
    wl = load_workload(rows_file, num_requests=2, seed=0)
    assert all(p.text.startswith(" turn ") for p in wl.prompts)
    assert wl.manifest()["prompt"] == {
        "requested": "raw",
        "applied": "raw",
        "tokenizer_dir": None,
        "template_file": None,
        "template_sha256": None,
        "note": None,
    }


def test_chat_template_applies_the_tokenizers_template(tmp_path: Path, rows_file: Path) -> None:
    tok = tokenizer(tmp_path)
    raw = load_workload(rows_file, num_requests=2, seed=0)
    wl = load_workload(rows_file, num_requests=2, seed=0, prompt="chat_template", tokenizer_dir=tok)
    assert [p.id for p in wl.prompts] == [p.id for p in raw.prompts]  # same rows chosen
    first = raw.prompts[0].text
    assert wl.prompts[0].text == f"<s><|user|>\n{first.strip()}<|end|>\n<|assistant|>\n"
    assert wl.prompts_sha256 != raw.prompts_sha256  # the manifest tells the two apart
    recorded = wl.manifest()["prompt"]
    assert recorded["applied"] == "chat_template"
    assert recorded["template_file"] == str(tok / "tokenizer_config.json")
    assert len(recorded["template_sha256"]) == 64


def test_chat_api_sends_messages_as_they_are(tmp_path: Path) -> None:
    texts, done = construct([" a "], "chat_template", "chat", tokenizer(tmp_path))
    assert texts == [" a "]
    assert done.applied == "server_chat_template" and "server applies" in (done.note or "")


def test_missing_template_is_an_error_naming_the_tokenizer(tmp_path: Path) -> None:
    tok = tokenizer(tmp_path, template=None)
    with pytest.raises(PromptError) as exc:
        construct(["a"], "chat_template", "generate", tok)
    msg = str(exc.value)
    assert msg.startswith(f"{tok}: the tokenizer has no chat template")
    assert "chat_template_or_raw" in msg


def test_missing_template_falls_back_only_when_allowed(tmp_path: Path) -> None:
    tok = tokenizer(tmp_path, template=None)
    texts, done = construct(["a"], "chat_template_or_raw", "generate", tok)
    assert texts == ["a"]
    assert done.requested == "chat_template_or_raw" and done.applied == "raw"
    assert (done.note or "").startswith("fell back:")


def test_missing_tokenizer_dir_says_how_to_point_at_one(tmp_path: Path) -> None:
    with pytest.raises(PromptError, match=r"not found on this machine.*--kimi-tokenizer"):
        construct(["a"], "chat_template", "generate", tmp_path / "absent")
    with pytest.raises(PromptError, match=r"tokenizer_config\.json: not found"):
        construct(["a"], "chat_template", "completions", tmp_path)


def test_template_files_and_named_templates(tmp_path: Path) -> None:
    tok = tokenizer(
        tmp_path,
        template=[
            {"name": "tool_use", "template": "T"},
            {"name": "default", "template": "D{{ messages[0].content }}"},
        ],
    )
    assert construct(["x"], "chat_template", "generate", tok)[0] == ["Dx"]
    (tok / "chat_template.jinja").write_text("J{{ messages[0]['content'] }}")
    template = load_chat_template(tok)
    assert template is not None and template.source == tok / "chat_template.jinja"
    assert construct(["x"], "chat_template", "generate", tok)[0] == ["Jx"]


def test_template_raising_is_an_error_naming_the_file(tmp_path: Path) -> None:
    tok = tokenizer(tmp_path, template="{{ raise_exception('only system roles') }}")
    with pytest.raises(
        PromptError, match=r"tokenizer_config\.json: chat template failed to render"
    ):
        construct(["x"], "chat_template", "generate", tok)


def test_shipped_mock_tokenizer_has_a_template() -> None:
    template = load_chat_template(TOKENIZER_DIR)
    assert template is not None
    # the mock's template adds nothing around one message: token counts stay the nominal ones
    assert template.render_first_turn("alpha beta") == "alpha beta"


def test_unknown_mode(tmp_path: Path) -> None:
    with pytest.raises(PromptError, match="is not one of raw, chat_template"):
        construct(["x"], "templated", "generate", None)

"""The bundled mock tokenizer: loads offline, counts tokens as words, never emits <unk>."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from pytest_kimi.mock import tokenizer_files
from pytest_kimi.mock.tokenizer_files import TOKENIZER_DIR, count_tokens, vocabulary
from pytest_kimi.workload.dataset import BUNDLED_DATASET, read_rows

tokenizers = pytest.importorskip("tokenizers")


@pytest.fixture(scope="module")
def tok():
    return tokenizers.Tokenizer.from_file(str(TOKENIZER_DIR / "tokenizer.json"))


def test_directory_has_the_files_loaders_look_for():
    names = {p.name for p in TOKENIZER_DIR.iterdir()}
    assert {
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "config.json",
    } <= names


def test_config_files():
    cfg = json.loads((TOKENIZER_DIR / "tokenizer_config.json").read_text())
    assert cfg["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert (cfg["bos_token"], cfg["eos_token"], cfg["unk_token"], cfg["pad_token"]) == (
        "<s>",
        "</s>",
        "<unk>",
        "<pad>",
    )
    assert cfg["model_max_length"] == 131072
    assert "messages" in cfg["chat_template"]
    model = json.loads((TOKENIZER_DIR / "config.json").read_text())
    assert model["model_type"] == "kimi_mock"
    assert model["architectures"] == ["KimiMockForCausalLM"]
    assert model["vocab_size"] == 1004
    assert model["max_position_embeddings"] == 131072
    special = json.loads((TOKENIZER_DIR / "special_tokens_map.json").read_text())
    assert special["unk_token"] == "<unk>"


def test_vocabulary_is_1000_plain_words_in_id_order(tok):
    words = vocabulary()
    assert len(words) == 1000 == len(set(words))
    assert all(w.isalpha() and w.islower() for w in words)
    assert [tok.token_to_id(w) for w in words] == list(range(4, 1004))
    assert tok.get_vocab_size() == 1004
    words.append("mutated")  # callers get a copy
    assert len(vocabulary()) == 1000


def test_unk_is_not_special(tok):
    data = json.loads((TOKENIZER_DIR / "tokenizer.json").read_text())
    assert data["model"]["type"] == "WordLevel"
    assert data["pre_tokenizer"]["type"] == "WhitespaceSplit"
    assert not [t for t in data["added_tokens"] if t["content"] == "<unk>" and t["special"]]
    assert {t["content"] for t in data["added_tokens"] if t["special"]} == {"<s>", "</s>", "<pad>"}
    cfg = json.loads((TOKENIZER_DIR / "tokenizer_config.json").read_text())
    unk = [v for v in cfg["added_tokens_decoder"].values() if v["content"] == "<unk>"]
    assert unk and not unk[0]["special"]
    # Decoding with skip_special_tokens keeps <unk>: it is an ordinary token.
    assert tok.decode([2], skip_special_tokens=True) == "<unk>"


def test_bundled_prompt_encodes_to_word_count_without_unk(tok):
    prompts = read_rows(BUNDLED_DATASET)
    for prompt in (prompts[0], prompts[len(prompts) // 2], prompts[-1]):
        ids = tok.encode(prompt.text).ids
        assert len(ids) == len(prompt.text.split()) == count_tokens(prompt.text)
        assert tok.token_to_id("<unk>") not in ids


def test_count_tokens_matches_tokenizer_on_odd_whitespace(tok):
    words = vocabulary()
    text = f"  {words[0]}\t{words[1]}\n\n{words[2]}   {words[3]} "
    assert count_tokens(text) == 4 == len(tok.encode(text).ids)
    assert count_tokens("") == 0
    assert tok.encode("notaword " + words[0]).ids == [2, 4]


def test_module_imports_no_heavy_libraries():
    code = (
        "import sys; import pytest_kimi.mock.tokenizer_files as t; t.vocabulary(); "
        "print(sorted(m for m in ('tokenizers', 'transformers', 'numpy') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=str(TOKENIZER_DIR.parents[2]),
    )
    assert out.stdout.strip() == "[]"
    assert tokenizer_files.TOKENIZER_DIR.is_dir()

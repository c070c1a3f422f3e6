"""Build the tiny tokenizer directory the mock server and the SGLang router load.

Why a tokenizer at all: the SGLang router loads a tokenizer from each worker's ``model_path``.
Without a local directory holding ``tokenizer.json`` it tries a model hub over the network,
which CI cannot reach. Peer clients (``sglang.bench_serving``, AIPerf, guidellm) also want a
tokenizer to count tokens. A tiny one keeps everything offline and makes token counts exact:

* model: ``tokenizers`` WordLevel; pre-tokenizer ``WhitespaceSplit``; no normalizer, no
  post-processor (no BOS added), so a text's token count is ``len(text.split())``;
* vocabulary: ids 0-3 are ``<s> </s> <unk> <pad>``, ids 4-1003 are 1000 pronounceable
  lowercase words (consonant-vowel-consonant-vowel), chosen deterministically, in sorted order;
* ``<s> </s> <pad>`` are special added tokens; ``<unk>`` is deliberately NOT special (the
  SGLang router mishandles a special unknown token, see shared/DESIGN.md);
* the chat template joins message contents with a newline and adds nothing else, so a chat
  request costs exactly the words of its messages.

Run ``python scripts/build_mock_tokenizer.py`` (needs ``pip install tokenizers``); it rewrites
``pytest_kimi/mock/tokenizer/`` byte for byte the same every time.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = ROOT / "pytest_kimi" / "mock" / "tokenizer"

BOS, EOS, UNK, PAD = "<s>", "</s>", "<unk>", "<pad>"
SPECIALS = (BOS, EOS, UNK, PAD)
NUM_WORDS = 1000
SEED = 20240601
CONSONANTS = "bdfgklmnprstvz"
VOWELS = "aeiou"
MAX_LEN = 131072

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{% if not loop.last %}{{ '\\n' }}{% endif %}"
    "{% endfor %}"
)


def make_words(n: int = NUM_WORDS, seed: int = SEED) -> list[str]:
    """Return ``n`` distinct CVCV words, a seeded sample of all of them, sorted."""
    syllables = [c + v for c, v in itertools.product(CONSONANTS, VOWELS)]
    every = sorted(a + b for a, b in itertools.product(syllables, repeat=2))
    return sorted(random.Random(seed).sample(every, n))


def _write_json(path: Path, data: object) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def build(out_dir: Path = OUT_DIR) -> None:
    """Write tokenizer.json, tokenizer_config.json, special_tokens_map.json and config.json."""
    try:
        from tokenizers import AddedToken, Tokenizer
        from tokenizers.models import WordLevel
        from tokenizers.pre_tokenizers import WhitespaceSplit
    except ImportError:  # pragma: no cover - developer convenience
        sys.exit("build_mock_tokenizer: `pip install tokenizers` first")

    words = make_words()
    vocab = {tok: i for i, tok in enumerate([*SPECIALS, *words])}
    tok = Tokenizer(WordLevel(vocab=vocab, unk_token=UNK))
    tok.pre_tokenizer = WhitespaceSplit()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in (BOS, EOS, PAD)])

    out_dir.mkdir(parents=True, exist_ok=True)
    # Save through json so the file is stable and readable (tokenizers sorts the vocab by id).
    _write_json(out_dir / "tokenizer.json", json.loads(tok.to_str()))

    added = {
        str(vocab[t]): {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": t != UNK,
        }
        for t in SPECIALS
    }
    _write_json(
        out_dir / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": BOS,
            "eos_token": EOS,
            "unk_token": UNK,
            "pad_token": PAD,
            "added_tokens_decoder": added,
            "add_bos_token": False,
            "add_eos_token": False,
            "clean_up_tokenization_spaces": False,
            "model_max_length": MAX_LEN,
            "chat_template": CHAT_TEMPLATE,
        },
    )
    _write_json(
        out_dir / "special_tokens_map.json",
        {"bos_token": BOS, "eos_token": EOS, "unk_token": UNK, "pad_token": PAD},
    )
    _write_json(
        out_dir / "config.json",
        {
            "model_type": "kimi_mock",
            "architectures": ["KimiMockForCausalLM"],
            "vocab_size": len(vocab),
            "max_position_embeddings": MAX_LEN,
            "bos_token_id": vocab[BOS],
            "eos_token_id": vocab[EOS],
            "pad_token_id": vocab[PAD],
            "torch_dtype": "bfloat16",
        },
    )


def main(argv: list[str] | None = None) -> None:
    """Command-line entry: optional ``--out DIR``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT_DIR, help="output directory")
    args = parser.parse_args(argv)
    build(args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

"""Write the bundled synthetic SPEED-Bench file ``pytest_kimi/data/speedbench_synthetic_16k.jsonl``.

Why synthetic: the real SPEED-Bench ``throughput_16k`` split cannot be fetched here, and some
published rows are placeholders. This file has the same shape so the whole pipeline runs
offline: 48 rows in SGLang's ``turns`` format, 16 per category (``low_entropy``, ``mixed``,
``high_entropy``), each prompt made only of words of the bundled mock tokenizer, so its token
count with that tokenizer is its word count.

Lengths: SPEED-Bench pads/truncates to 16K tokens with tiktoken ``o200k_base``; with another
model's tokenizer the count is only nominal. To mimic that, most prompts are within 2% of
16,384 words and three are outliers at the edges of the 15,600..16,900 band.

Content: ``low_entropy`` repeats a short passage drawn from a few dozen words (with rare
substitutions), ``high_entropy`` draws every word uniformly from the vocabulary, ``mixed``
alternates repetitive and random stretches.

Deterministic: ``python scripts/make_synthetic_speedbench.py`` rewrites the same bytes
(seed ``SEED``); rebuild the tokenizer first if its vocabulary changes.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pytest_kimi.mock.tokenizer_files import vocabulary  # noqa: E402

OUT_FILE = ROOT / "pytest_kimi" / "data" / "speedbench_synthetic_16k.jsonl"
SEED = 16384
NOMINAL = 16384
ROWS_PER_CATEGORY = 16
CATEGORIES = ("low_entropy", "mixed", "high_entropy")
# (row index, word count): rows deliberately far from nominal, as with another tokenizer.
OUTLIERS = {5: 15_620, 22: 16_880, 41: 15_655}


def _passage(rng: random.Random, words: list[str]) -> list[str]:
    """A short passage over a small word subset: the unit that low-entropy text repeats."""
    subset = rng.sample(words, rng.randint(20, 50))
    return [rng.choice(subset) for _ in range(rng.randint(40, 120))]


def _repetitive(rng: random.Random, words: list[str], n: int) -> list[str]:
    """``n`` words repeating one passage, with about 2% substitutions from the same subset."""
    passage = _passage(rng, words)
    out = [passage[i % len(passage)] for i in range(n)]
    for i in range(n):
        if rng.random() < 0.02:
            out[i] = rng.choice(passage)
    return out


def _random(rng: random.Random, words: list[str], n: int) -> list[str]:
    """``n`` words drawn uniformly from the whole vocabulary."""
    return rng.choices(words, k=n)


def _mixed(rng: random.Random, words: list[str], n: int) -> list[str]:
    """Alternating repetitive and random stretches of 500..3000 words."""
    out: list[str] = []
    repetitive = rng.random() < 0.5
    while len(out) < n:
        size = min(rng.randint(500, 3000), n - len(out))
        out += _repetitive(rng, words, size) if repetitive else _random(rng, words, size)
        repetitive = not repetitive
    return out


GENERATORS = {"low_entropy": _repetitive, "mixed": _mixed, "high_entropy": _random}


def make_rows(
    seed: int = SEED, nominal: int = NOMINAL, rows_per_category: int = ROWS_PER_CATEGORY
) -> list[dict[str, object]]:
    """Return the rows (48 by default), grouped by category, with stable question ids. The
    outliers are the bundled 16K file's; another length (``--nominal``, e.g. the 512 words of
    ``clusters/cpu-sglang-prompts.jsonl``) keeps every prompt within 2% of it."""
    words = vocabulary()
    rng = random.Random(seed)
    outliers = OUTLIERS if nominal == NOMINAL else {}
    prefix = "synth16k" if nominal == NOMINAL else f"synth{nominal}"
    rows: list[dict[str, object]] = []
    for category in CATEGORIES:
        for k in range(rows_per_category):
            index = len(rows)
            n = outliers.get(index, round(nominal * rng.uniform(0.98, 1.02)))
            text = " ".join(GENERATORS[category](rng, words, n))
            rows.append(
                {
                    "question_id": f"{prefix}-{category}-{k:02d}",
                    "category": category,
                    "turns": [text],
                }
            )
    return rows


def main(argv: list[str] | None = None) -> None:
    """Command-line entry: optional ``--out FILE``, ``--nominal WORDS``, ``--rows-per-category``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT_FILE, help="output .jsonl file")
    parser.add_argument("--nominal", type=int, default=NOMINAL, help="words (tokens) per prompt")
    parser.add_argument("--rows-per-category", type=int, default=ROWS_PER_CATEGORY)
    args = parser.parse_args(argv)
    rows = make_rows(nominal=args.nominal, rows_per_category=args.rows_per_category)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", encoding="utf-8", newline="\n") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"wrote {len(rows)} rows to {args.out}")


if __name__ == "__main__":
    main()

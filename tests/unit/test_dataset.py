"""SPEED-Bench loading: both row formats, selection, checksums, and errors that say where."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from pytest_kimi.workload.dataset import (
    BUNDLED_DATASET,
    PLACEHOLDER_MARKERS,
    DatasetError,
    Prompt,
    Workload,
    load_workload,
    read_rows,
    resolve_dataset,
)


def write_jsonl(path: Path, rows: list[object]) -> Path:
    """Write rows as JSON lines; str rows are written verbatim (for malformed input)."""
    lines = [r if isinstance(r, str) else json.dumps(r) for r in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def turns_row(i: int, category: str = "mixed") -> dict[str, object]:
    return {"question_id": f"q{i}", "category": category, "turns": [f"prompt number {i}"]}


@pytest.fixture
def ten_rows(tmp_path: Path) -> Path:
    cats = ["low_entropy", "mixed", "high_entropy"]
    return write_jsonl(tmp_path / "ten.jsonl", [turns_row(i, cats[i % 3]) for i in range(10)])


def assert_where(
    exc: pytest.ExceptionInfo[DatasetError], path: Path, line: int, field: str | None
) -> str:
    msg = str(exc.value)
    assert msg.startswith(f"{path}:{line}: "), msg
    if field is not None:
        assert f"field '{field}'" in msg, msg
    return msg


# --- formats -------------------------------------------------------------------------------


def test_turns_format(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "t.jsonl",
        [
            {
                "question_id": "a",
                "category": "low_entropy",
                "turns": ["hello there", "second turn"],
            },
        ],
    )
    assert read_rows(path) == [Prompt(id="a", category="low_entropy", text="hello there", line=1)]


def test_messages_format_takes_first_user_message(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "m.jsonl",
        [
            {
                "question_id": 7,
                "category": "high_entropy",
                "messages": [
                    {"role": "system", "content": "be brief"},
                    {"role": "user", "content": "first question"},
                    {"role": "assistant", "content": "answer"},
                    {"role": "user", "content": "follow up"},
                ],
            },
            {
                "category": "mixed",
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "part one "},
                            {"type": "image_url", "image_url": {"url": "x"}},
                            {"type": "text", "text": "part two"},
                        ],
                    },
                ],
            },
        ],
    )
    first, second = read_rows(path)
    assert first == Prompt(id="7", category="high_entropy", text="first question", line=1)
    assert second == Prompt(id="line-2", category="mixed", text="part one part two", line=2)


def test_blank_lines_skipped_and_line_numbers_kept(tmp_path: Path) -> None:
    path = tmp_path / "b.jsonl"
    path.write_text(
        "\n" + json.dumps(turns_row(1)) + "\n   \n" + json.dumps(turns_row(2)), encoding="utf-8"
    )
    assert [(p.id, p.line) for p in read_rows(path)] == [("q1", 2), ("q2", 4)]


def test_missing_id_and_category_get_defaults(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [{"turns": ["x y"]}, {"turns": ["z"]}])
    assert [(p.id, p.category) for p in read_rows(path)] == [
        ("line-1", "uncategorized"),
        ("line-2", "uncategorized"),
    ]


def test_utf8_bom_and_crlf_accepted(tmp_path: Path) -> None:
    path = tmp_path / "bom.jsonl"
    path.write_bytes(
        b"\xef\xbb\xbf"
        + json.dumps(turns_row(1)).encode()
        + b"\r\n"
        + json.dumps(turns_row(2)).encode()
        + b"\r\n"
    )
    assert [p.id for p in read_rows(path)] == ["q1", "q2"]


# --- errors: each names file, line and field -------------------------------------------------

ERROR_CASES = [
    ("malformed_json", '{"turns": ["a"]', None, "invalid JSON"),
    ("not_object", '["a", "b"]', None, "expected an object with 'turns' or 'messages'"),
    ("missing_turns_and_messages", {"category": "mixed", "prompt": "x"}, "turns", "'messages'"),
    ("turns_not_list", {"turns": "text"}, "turns", "expected an array"),
    ("turns_empty_list", {"turns": []}, "turns", "empty prompt"),
    ("turn_not_string", {"turns": [3]}, "turns[0]", "expected a string, got number"),
    ("empty_prompt", {"turns": ["   "]}, "turns", "empty prompt"),
    (
        "placeholder_turns",
        {"turns": ["Full benchmark data should be fetched from the hub"]},
        "turns",
        "placeholder",
    ),
    ("messages_not_list", {"messages": {"role": "user"}}, "messages", "expected an array"),
    ("message_not_object", {"messages": ["hi"]}, "messages[0]", "expected an object"),
    (
        "no_user_message",
        {"messages": [{"role": "system", "content": "s"}]},
        "messages",
        "role 'user'",
    ),
    ("content_missing", {"messages": [{"role": "user"}]}, "messages[0].content", "missing"),
    (
        "content_wrong_type",
        {"messages": [{"role": "user", "content": 5}]},
        "messages[0].content",
        "expected a string",
    ),
    (
        "content_empty",
        {"messages": [{"role": "user", "content": ""}]},
        "messages[0].content",
        "empty prompt",
    ),
    (
        "placeholder_messages",
        {"messages": [{"role": "user", "content": "xx " + PLACEHOLDER_MARKERS[0] + " yy"}]},
        "messages[0].content",
        "placeholder",
    ),
    ("category_wrong_type", {"category": 3, "turns": ["a"]}, "category", "non-empty string"),
    (
        "question_id_wrong_type",
        {"question_id": [1], "turns": ["a"]},
        "question_id",
        "string or integer",
    ),
]


@pytest.mark.parametrize(
    ("row", "field", "text"), [c[1:] for c in ERROR_CASES], ids=[c[0] for c in ERROR_CASES]
)
def test_bad_row_error_names_file_line_field(
    tmp_path: Path, row: object, field: str | None, text: str
) -> None:
    path = write_jsonl(tmp_path / "bad.jsonl", [turns_row(1), "", turns_row(2), row])
    with pytest.raises(DatasetError) as exc:
        read_rows(path)
    msg = assert_where(exc, path, 4, field)
    assert text in msg
    # the same error surfaces through load_workload, before any selection
    with pytest.raises(DatasetError, match=r"bad\.jsonl:4: "):
        load_workload(path, num_requests=1)


def test_malformed_json_includes_the_json_error(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "j.jsonl", [turns_row(1), '{"turns": ["a"] "category": 1}'])
    with pytest.raises(DatasetError) as exc:
        read_rows(path)
    msg = assert_where(exc, path, 2, None)
    assert "Expecting ',' delimiter" in msg and "column" in msg


def test_duplicate_question_id(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "dup.jsonl", [turns_row(1), turns_row(2), turns_row(1)])
    with pytest.raises(DatasetError) as exc:
        read_rows(path)
    assert "first on line 1" in assert_where(exc, path, 3, "question_id")


@pytest.mark.parametrize("content", ["", "\n\n  \n"])
def test_blank_file(tmp_path: Path, content: str) -> None:
    path = tmp_path / "blank.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(DatasetError) as exc:
        read_rows(path)
    assert "no rows" in assert_where(exc, path, 1, None)


def test_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(json.dumps(turns_row(1)).encode() + b"\n" + b'{"turns": ["caf\xe9"]}\n')
    with pytest.raises(DatasetError) as exc:
        read_rows(path)
    assert "UTF-8" in assert_where(exc, path, 2, None)


def test_missing_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "nope.jsonl"
    with pytest.raises(DatasetError, match=r"nope\.jsonl: dataset file not found"):
        read_rows(path)
    with pytest.raises(DatasetError, match=r"nope\.jsonl"):
        load_workload(path, num_requests=1)


def test_dataset_error_is_value_error() -> None:
    assert issubclass(DatasetError, ValueError)


# --- selection -------------------------------------------------------------------------------


def test_category_filter(ten_rows: Path) -> None:
    wl = load_workload(ten_rows, num_requests=3, category="mixed")
    assert {p.category for p in wl.prompts} == {"mixed"}
    assert sorted(p.id for p in wl.prompts) == ["q1", "q4", "q7"]
    assert wl.category == "mixed" and len(wl) == 3


def test_unknown_category_lists_categories_present(ten_rows: Path) -> None:
    with pytest.raises(DatasetError) as exc:
        load_workload(ten_rows, num_requests=1, category="medium_entropy")
    msg = str(exc.value)
    assert str(ten_rows) in msg and "'medium_entropy'" in msg
    assert "high_entropy (3), low_entropy (4), mixed (3)" in msg


def test_too_few_rows(ten_rows: Path) -> None:
    expected = r"ten\.jsonl: has 3 rows \(category mixed\), 5 requested"
    with pytest.raises(DatasetError, match=expected):
        load_workload(ten_rows, num_requests=5, category="mixed")
    with pytest.raises(DatasetError, match=r"has 10 rows \(all categories\), 11 requested"):
        load_workload(ten_rows, num_requests=11)


@pytest.mark.parametrize("bad", [0, -1, True, 2.0])
def test_num_requests_must_be_positive_int(ten_rows: Path, bad: object) -> None:
    with pytest.raises(ValueError, match="num_requests"):
        load_workload(ten_rows, num_requests=bad)  # type: ignore[arg-type]


def test_same_seed_same_selection_different_seed_different(ten_rows: Path) -> None:
    a = load_workload(ten_rows, num_requests=5, seed=1)
    b = load_workload(ten_rows, num_requests=5, seed=1)
    c = load_workload(ten_rows, num_requests=5, seed=2)
    assert a == b
    assert [p.id for p in a.prompts] != [p.id for p in c.prompts]
    assert a.prompts_sha256 != c.prompts_sha256
    assert a.file_sha256 == c.file_sha256
    assert len({p.id for p in a.prompts}) == 5  # without replacement


def test_selection_is_random_sample_over_filtered_rows(ten_rows: Path) -> None:
    import random

    rows = [p for p in read_rows(ten_rows) if p.category == "low_entropy"]
    wl = load_workload(ten_rows, num_requests=4, seed=9, category="low_entropy")
    assert list(wl.prompts) == random.Random(9).sample(rows, 4)


def test_checksums_defined_and_change(tmp_path: Path, ten_rows: Path) -> None:
    wl = load_workload(ten_rows, num_requests=4, seed=3)
    assert wl.file_sha256 == hashlib.sha256(ten_rows.read_bytes()).hexdigest()
    expected = hashlib.sha256(b"".join(p.text.encode() + b"\n" for p in wl.prompts)).hexdigest()
    assert wl.prompts_sha256 == expected
    assert wl.seed == 3 and wl.category is None and wl.path == ten_rows

    # Same prompts, different file bytes (an added blank line): file hash changes, prompts' not.
    padded = tmp_path / "padded.jsonl"
    padded.write_bytes(ten_rows.read_bytes() + b"\n")
    wl2 = load_workload(padded, num_requests=4, seed=3)
    assert wl2.file_sha256 != wl.file_sha256
    assert wl2.prompts_sha256 == wl.prompts_sha256

    # One prompt text edited: both change (if the edited row is selected).
    rows = [turns_row(i, ["low_entropy", "mixed", "high_entropy"][i % 3]) for i in range(10)]
    for row in rows:
        row["turns"] = [row["turns"][0] + " edited"]  # type: ignore[index]
    wl3 = load_workload(write_jsonl(tmp_path / "edited.jsonl", rows), num_requests=4, seed=3)
    assert wl3.file_sha256 != wl.file_sha256
    assert wl3.prompts_sha256 != wl.prompts_sha256

    # Fewer requests: a different selection, a different prompts hash.
    assert load_workload(ten_rows, num_requests=3, seed=3).prompts_sha256 != wl.prompts_sha256


def test_manifest_is_json_ready(ten_rows: Path) -> None:
    wl = load_workload(ten_rows, num_requests=2, seed=0)
    data = json.loads(json.dumps(wl.manifest()))
    assert data["file_sha256"] == wl.file_sha256
    assert data["prompt_ids"] == [p.id for p in wl.prompts]
    assert isinstance(wl, Workload)


# --- resolve_dataset -------------------------------------------------------------------------


def test_resolve_builtin() -> None:
    assert resolve_dataset("builtin:speedbench16k") == BUNDLED_DATASET


def test_resolve_unknown_builtin() -> None:
    with pytest.raises(DatasetError, match="builtin:speedbench16k"):
        resolve_dataset("builtin:speedbench99k")


def test_resolve_relative_against_base_dir(
    tmp_path: Path, ten_rows: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert resolve_dataset("ten.jsonl", base_dir=tmp_path) == tmp_path / "ten.jsonl"
    assert resolve_dataset(Path("ten.jsonl"), base_dir=tmp_path) == tmp_path / "ten.jsonl"
    assert resolve_dataset(str(ten_rows), base_dir=Path("/elsewhere")) == ten_rows
    monkeypatch.chdir(tmp_path)
    assert resolve_dataset("ten.jsonl") == tmp_path / "ten.jsonl"


def test_resolve_missing_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(DatasetError) as exc:
        resolve_dataset("data/missing.jsonl", base_dir=tmp_path)
    assert str(tmp_path / "data" / "missing.jsonl") in str(exc.value)
    assert resolve_dataset(tmp_path) == tmp_path  # a snapshot directory is a dataset too


# --- bundled file ----------------------------------------------------------------------------


def test_bundled_file_rows() -> None:
    rows = read_rows(BUNDLED_DATASET)
    assert len(rows) == 48
    counts: dict[str, int] = {}
    for p in rows:
        counts[p.category] = counts.get(p.category, 0) + 1
    assert counts == {"low_entropy": 16, "mixed": 16, "high_entropy": 16}
    lengths = [len(p.text.split()) for p in rows]
    assert all(15_600 <= n <= 16_900 for n in lengths)
    assert sum(abs(n / 16384 - 1) <= 0.03 for n in lengths) >= 40
    for p in rows:
        assert " ".join(p.text.split()) == p.text  # single spaces, no padding


def test_bundled_entropy_differs_by_category() -> None:
    distinct: dict[str, list[int]] = {}
    for p in read_rows(BUNDLED_DATASET):
        distinct.setdefault(p.category, []).append(len(set(p.text.split())))
    assert max(distinct["low_entropy"]) < 100
    assert min(distinct["high_entropy"]) > 900


def test_bundled_loads_40_requests() -> None:
    wl = load_workload(resolve_dataset("builtin:speedbench16k"), num_requests=40, seed=0)
    assert len(wl.prompts) == 40 == len({p.id for p in wl.prompts})
    assert all(15_600 <= len(p.text.split()) <= 16_900 for p in wl.prompts)
    assert len(wl.file_sha256) == len(wl.prompts_sha256) == 64

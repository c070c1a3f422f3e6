"""Sessions from files: SPEED-Bench rows of several turns, and ShareGPT-style conversations.

Two JSONL formats, told apart by their fields (the first row decides; a row of the other
format further down is refused where it is):

* SPEED-Bench and SGLang's loader, ``{"question_id", "category", "turns": ["...", ...]}``, or
  NeMo/AIPerf's ``{"question_id", "category", "messages": [{"role", "content"}, ...]}``: each
  user turn (each ``user`` message) is a turn of the session; a ``system`` message is its
  system prompt; ``assistant`` messages are left out, since a session sends back what the
  server answered;
* ShareGPT, ``{"id", "conversations": [{"from": "human" | "gpt" | "system", "value"}, ...]}``
  (also ``user`` / ``assistant``, as ShareGPT exports vary): each ``human`` value is a turn,
  a ``system`` value the system prompt; ``gpt`` values are left out for the same reason.

Every refusal says where, as the single-turn reader does (``file:line: field 'x': ...``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from pytest_kimi.workload.rows import (
    UNCATEGORIZED,
    DatasetError,
    check_text,
    fail,
    json_object,
    text_lines,
    type_name,
)
from pytest_kimi.workload.sessions import Session

SPEEDBENCH, SHAREGPT = "speedbench", "sharegpt"
SHAREGPT_USER = ("human", "user")
SHAREGPT_ANSWER = ("gpt", "assistant", "chatgpt", "bard", "model")


def row_format(where: str, row: Mapping[str, object]) -> str:
    """Which format a row is in, by its fields."""
    if "conversations" in row:
        return SHAREGPT
    if "turns" in row or "messages" in row:
        return SPEEDBENCH
    raise fail(where, "missing: a session needs 'turns' or 'messages' (SPEED-Bench) or "
                      "'conversations' (ShareGPT)", "turns")  # fmt: skip


def speedbench_session(where: str, row: Mapping[str, object], number: int) -> Session:
    """A SPEED-Bench row (``turns`` or ``messages``) as a session."""
    system = ""
    if "turns" in row:
        turns = row["turns"]
        if not isinstance(turns, list) or not turns:
            raise fail(where, f"expected a non-empty array of strings, got {type_name(turns)}",
                       "turns")  # fmt: skip
        texts = []
        for k, turn in enumerate(turns):
            if not isinstance(turn, str):
                raise fail(where, f"expected a string, got {type_name(turn)}", f"turns[{k}]")
            texts.append(check_text(where, f"turns[{k}]", turn))
    else:
        system, texts = _from_messages(where, row["messages"])
    return Session(_row_id(where, row, "question_id", number), tuple(texts), system,
                   _category(where, row))  # fmt: skip


def sharegpt_session(where: str, row: Mapping[str, object], number: int) -> Session:
    """A ShareGPT conversation as a session."""
    conversation = row["conversations"]
    if not isinstance(conversation, list):
        raise fail(where, f"expected an array of objects, got {type_name(conversation)}",
                   "conversations")  # fmt: skip
    system, texts = "", []
    for k, message in enumerate(conversation):
        field = f"conversations[{k}]"
        if not isinstance(message, dict):
            raise fail(where, f"expected an object, got {type_name(message)}", field)
        speaker, value = message.get("from"), message.get("value")
        if not isinstance(value, str):
            raise fail(where, f"expected a string, got {type_name(value)}", f"{field}.value")
        if speaker == "system":
            system = value
        elif speaker in SHAREGPT_USER:
            texts.append(check_text(where, f"{field}.value", value))
        elif speaker not in SHAREGPT_ANSWER:
            known = ", ".join(("system", *SHAREGPT_USER, *SHAREGPT_ANSWER))
            raise fail(where, f"unknown speaker {speaker!r}: expected one of {known}",
                       f"{field}.from")  # fmt: skip
    if not texts:
        raise fail(where, "no user turn ('from': 'human')", "conversations")
    return Session(_row_id(where, row, "id", number), tuple(texts), system, _category(where, row))


def read_sessions(path: Path) -> list[Session]:
    """Every session of a JSONL file, in file order; ids must be unique."""
    sessions: list[Session] = []
    fmt: str | None = None
    seen: dict[str, int] = {}
    for number, line in enumerate(text_lines(path), start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        row = json_object(where, line)
        this = row_format(where, row)
        fmt = fmt or this
        if this != fmt:
            raise fail(where, f"a {this} row in a {fmt} file (the first row decides the format)")
        session = (sharegpt_session if fmt == SHAREGPT else speedbench_session)(where, row, number)
        if session.id in seen:
            raise fail(where, f"session id {session.id!r} again (first at line "
                              f"{seen[session.id]})", "id")  # fmt: skip
        seen[session.id] = number
        sessions.append(session)
    if not sessions:
        raise DatasetError(f"{path}: no sessions (an empty file)")
    return sessions


def _from_messages(where: str, messages: object) -> tuple[str, list[str]]:
    if not isinstance(messages, list):
        raise fail(where, f"expected an array of objects, got {type_name(messages)}", "messages")
    system, texts = "", []
    for k, message in enumerate(messages):
        field = f"messages[{k}]"
        if not isinstance(message, dict):
            raise fail(where, f"expected an object, got {type_name(message)}", field)
        content = message.get("content")
        if not isinstance(content, str):
            raise fail(where, f"expected a string, got {type_name(content)}", f"{field}.content")
        if message.get("role") == "system":
            system = content
        elif message.get("role") == "user":
            texts.append(check_text(where, f"{field}.content", content))
    if not texts:
        raise fail(where, "no message with role 'user'", "messages")
    return system, texts


def _row_id(where: str, row: Mapping[str, object], key: str, number: int) -> str:
    value = row.get(key)
    if value is None or value == "":
        return f"line-{number}"
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise fail(where, f"expected a string or integer, got {type_name(value)}", key)
    return str(value)


def _category(where: str, row: Mapping[str, object]) -> str:
    category = row.get("category", UNCATEGORIZED)
    if not isinstance(category, str) or not category.strip():
        raise fail(where, f"expected a non-empty string, got {category!r}", "category")
    return category

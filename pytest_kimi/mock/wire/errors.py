"""SGLang's error answers, per version (``srt/entrypoints/http_server.py``,
``openai/serving_base.py``, ``openai/protocol.py``'s ``ErrorResponse``).

* a body FastAPI cannot validate (not JSON, a required field missing): 400, ``ErrorResponse``
  of type ``Bad Request`` (SGLang's request-validation handler), on every route;
* ``/generate`` refusing a request (``ValueError`` in the tokenizer manager: no prompt, too
  long): 400 ``{"error": {"message"}}``; once streaming has begun, a 200 stream whose one
  event is that object (0.5.23 adds ``type``, ``code``, ``retryable``) before ``[DONE]``;
* the OpenAI routes refusing one: 400 ``ErrorResponse`` of type ``BadRequestError``; 0.5.9
  validates a streamed request inside the stream (a 200 stream of ``{"error": ...}``), 0.5.23
  before it starts (a 400).
"""

from __future__ import annotations

from typing import Any

NO_PROMPT = "Either text, input_ids or input_embeds should be provided."


def error_response(message: str, kind: str = "BadRequestError", code: int = 400) -> dict:
    """``ErrorResponse``: flat, not nested under ``error``."""
    return {"object": "error", "message": message, "type": kind, "param": None, "code": code}


def generate_error(version: str, message: str, streaming: bool) -> dict[str, Any]:
    """``/generate``'s refusal: the 400 body, or (``streaming``) the stream's one event."""
    if streaming and version != "0.5.9":
        return {"error": {"message": message, "type": "invalid_request_error", "code": 400,
                          "retryable": False}}  # fmt: skip
    return {"error": {"message": message}}


def openai_refusal_streams(version: str) -> bool:
    """Whether a streamed OpenAI request is refused inside a 200 stream (0.5.9) rather than
    with a 400 before it (0.5.23)."""
    return version == "0.5.9"


def too_long(prompt: int, max_new: int, context: int) -> str | None:
    """SGLang's length checks (``TokenizerManager._validate_one_request``, no auto-truncate):
    the prompt must be shorter than the context, and with ``max_new_tokens`` fit in it."""
    if prompt >= context:
        return (f"The input ({prompt} tokens) is longer than the model's context length "
                f"({context} tokens).")  # fmt: skip
    if prompt + max_new >= context:
        return (f"Requested token count exceeds the model's maximum context length of "
                f"{context} tokens. You requested a total of {prompt + max_new} tokens: "
                f"{prompt} tokens from the input messages and {max_new} tokens for the "
                f"completion. Please reduce the number of tokens in the input messages or "
                f"the completion to fit within the limit.")  # fmt: skip
    return None

"""Reads the two fields the gateway routes by (`model`, `stream`) from a request body.

Pure and standard-library only: it also runs in worker processes, which import this module
and nothing else of the gateway.
"""

from __future__ import annotations

import json
from typing import Any


def skim(raw: bytes) -> tuple[str, bool] | str:
    """`(model, stream)` from an OpenAI request body, or why the body is refused."""
    try:
        body: Any = json.loads(raw)
    except RecursionError:
        return "the request body is nested too deeply to be read as JSON"
    except (ValueError, UnicodeDecodeError) as exc:
        return f"the request body is not valid JSON: {exc}"
    if not isinstance(body, dict):
        return "the request body must be a JSON object"
    name = body.get("model")
    if not isinstance(name, str) or not name:
        return "the request body must name a `model` (a string)"
    return name, body.get("stream") is True

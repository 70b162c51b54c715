"""Command-line numbers refused outside their range, one way for every msgpu_verify command (Python 3.8)."""

from __future__ import annotations

import argparse
from typing import Any, Callable, Optional


def bounded(flag: str, kind: type, low: float, high: float, allowed: Optional[str] = None) -> Callable[[str], Any]:
    """An argparse type: ``kind`` of the text within [low, high]; anything else is argparse's exit 2 naming
    the flag, the value and what is allowed (``allowed``, or "<kind> from <low> to <high>")."""
    words = allowed or f"{kind.__name__} from {low:g} to {high:g}"

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} {text!r}: allowed is {words}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{flag} {text!r}: allowed is {words}")
        return value

    return parse

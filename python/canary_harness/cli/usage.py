"""Command-line values: the one-line usage error (exit 2) and the counts every entry point
reads the same way. The lowest floor of the package's commands: the lane, the runner's CLI
and the distributed launcher import it, and it imports none of them.
"""

from __future__ import annotations

from typing import Optional


class UsageError(Exception):
    """Bad usage or bad input: one line, exit 2, nothing written."""


def all_digits(text: str) -> bool:
    """ASCII digits only: str.isdigit() also takes '²' and other Unicode digits, which int() refuses."""
    return text.isascii() and text.isdigit()


def count_flag(flag: str, text: Optional[str], low: int, high: int) -> Optional[int]:
    if text is None:
        return None
    if not all_digits(text) or not low <= int(text) <= high:
        raise UsageError(f"--{flag}: '{text}' is not a number in {low}..{high}")
    return int(text)

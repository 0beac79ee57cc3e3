"""/manifest/budget_features (docs/budgets.md): the features that separate a run from the
bitwise reference, each the name of a budget entry ([bf16], [torch-cpu]), each once, in the
writer's order; written joined with '+', "" for none. The package's one parse and one format
of it, with the messages of the C++ one (receipt::BudgetFeatures,
harness/receipt/budget_features.h), so that a writer refuses what `harness validate` would."""

from __future__ import annotations

import re
from typing import Iterable, List

_NAME = re.compile(r"[A-Za-z0-9_-]+")


def is_feature_name(name: str) -> bool:
    """A budget entry's name: letters, digits, '-' and '_' ('+' joins them)."""
    return _NAME.fullmatch(name) is not None


def _checked(names: List[str], text: str) -> List[str]:
    for index, name in enumerate(names):
        if not name:
            raise ValueError(f"'{text}' has an empty feature name (item {index + 1}); give names joined with '+', "
                             "or \"\" for none")
        if name in names[:index]:
            raise ValueError(f"'{text}' names feature '{name}' twice")
        if not is_feature_name(name):
            raise ValueError(f"'{text}': feature name '{name}' is not letters, digits, '-' and '_'")
    return names


def parse_features(text: str) -> List[str]:
    """The names `text` declares, in order; ValueError (one line) when one is empty, repeated
    or not a feature name."""
    return _checked(text.split("+") if text else [], text)


def format_features(names: Iterable[str]) -> str:
    """`names` joined with '+' ("" for none), refused as parse_features refuses them."""
    names = list(names)
    text = "+".join(names)
    _checked(names, text)
    return text

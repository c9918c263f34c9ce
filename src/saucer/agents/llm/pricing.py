"""What a model call costs: tokens × a per-model price table.

The table ships with saucer (``prices.json`` in this package, USD per one
million tokens) and can be overridden by a file of the same shape (JSON, or
TOML with a ``[models."name"]`` table per model); entries of the override file
replace the shipped ones model by model.

A model that is not in the table has an *unknown* cost: :meth:`PriceTable.cost`
returns ``None`` and :func:`format_cost` prints ``"unknown"``. It is never
counted as 0, because a silent 0 makes an expensive run look free.
"""

from __future__ import annotations

import json
import math
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

__all__ = ["ModelPrice", "PriceTable", "PriceFileError", "format_cost", "SHIPPED_PRICE_FILE"]

#: The name of the price table shipped inside this package.
SHIPPED_PRICE_FILE = "prices.json"
_PER = 1_000_000
# "gpt-4o-2024-08-06" and "gpt-4-0613" are priced as their family.
_DATE_SUFFIX = re.compile(r"-(\d{4}-\d{2}-\d{2}|\d{4})$")


class PriceFileError(ValueError):
    """A price file is malformed; the message names the file and the entry."""


@dataclass(frozen=True)
class ModelPrice:
    """USD per one million tokens."""

    input: float
    output: float
    cached_input: float | None = None

    def cost(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> float:
        """The cost of one call; cached prompt tokens use ``cached_input`` when the table has it."""
        cached = min(max(cached_tokens, 0), prompt_tokens) if self.cached_input is not None else 0
        fresh = prompt_tokens - cached
        total = fresh * self.input + cached * (self.cached_input or 0.0) + completion_tokens * self.output
        return total / _PER


def _parse_price(where: str, model: str, entry: Any) -> ModelPrice:
    if not isinstance(entry, Mapping):
        raise PriceFileError(f"{where}: models.{model} must be a table with input and output prices, got {entry!r}")

    def price(field: str) -> float | None:
        raw = entry.get(field)
        if raw is None:
            return None
        if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not math.isfinite(raw) or raw < 0:
            raise PriceFileError(f"{where}: models.{model}.{field} must be a non-negative number, got {raw!r}")
        return float(raw)

    def required(field: str) -> float:
        value = price(field)
        if value is None:
            raise PriceFileError(f"{where}: models.{model}.{field} is missing (USD per 1M tokens)")
        return value

    input_price, output_price, cached_price = required("input"), required("output"), price("cached_input")
    unknown = set(entry) - {"input", "output", "cached_input"}
    if unknown:
        raise PriceFileError(f"{where}: models.{model} has unknown field(s) {', '.join(sorted(unknown))}")
    return ModelPrice(input_price, output_price, cached_price)


def _parse_table(where: str, data: Any) -> dict[str, ModelPrice]:
    if not isinstance(data, Mapping) or not isinstance(data.get("models"), Mapping):
        raise PriceFileError(f"{where}: expected a top-level 'models' table mapping model names to prices")
    return {str(name).lower(): _parse_price(where, str(name), entry) for name, entry in data["models"].items()}


class PriceTable:
    """Prices per model; ``cost`` is None for a model the table does not know."""

    def __init__(self, prices: Mapping[str, ModelPrice] | None = None) -> None:
        self._prices: dict[str, ModelPrice] = {k.lower(): v for k, v in (prices or {}).items()}

    @classmethod
    def shipped(cls) -> PriceTable:
        """The table shipped with saucer."""
        text = resources.files(__package__).joinpath(SHIPPED_PRICE_FILE).read_text(encoding="utf-8")
        return cls(_parse_table(f"saucer/agents/llm/{SHIPPED_PRICE_FILE}", json.loads(text)))

    @classmethod
    def load(cls, override: str | Path | None = None) -> PriceTable:
        """The shipped table, with the entries of ``override`` (a JSON or TOML file) on top."""
        table = cls.shipped()
        if override:
            table._prices.update(cls.from_file(override)._prices)
        return table

    @classmethod
    def from_file(cls, path: str | Path) -> PriceTable:
        """A table read from one JSON or TOML file (by extension; JSON otherwise)."""
        p = Path(path)
        try:
            raw = p.read_bytes()
        except FileNotFoundError:
            raise PriceFileError(f"price file {p} does not exist (set [llm] price_file to an existing file)") from None
        try:
            data = tomllib.loads(raw.decode("utf-8")) if p.suffix.lower() == ".toml" else json.loads(raw)
        except (tomllib.TOMLDecodeError, json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise PriceFileError(
                f"price file {p} is not valid {'TOML' if p.suffix.lower() == '.toml' else 'JSON'}: {exc}"
            ) from None
        return cls(_parse_table(str(p), data))

    def price(self, model: str) -> ModelPrice | None:
        """The price of ``model``: exact name, then without a ``provider/`` prefix, then without a date suffix."""
        name = model.lower().strip()
        candidates = [name]
        if "/" in name:
            candidates.append(name.rsplit("/", 1)[1])
        candidates += [_DATE_SUFFIX.sub("", c) for c in list(candidates)]
        for candidate in candidates:
            if candidate in self._prices:
                return self._prices[candidate]
        return None

    def cost(self, model: str, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> float | None:
        """USD for one call, or None when the model's price is unknown."""
        price = self.price(model)
        if price is None:
            return None
        return price.cost(prompt_tokens, completion_tokens, cached_tokens)

    def __contains__(self, model: object) -> bool:
        return isinstance(model, str) and self.price(model) is not None

    def models(self) -> list[str]:
        """The model names the table prices."""
        return sorted(self._prices)


def format_cost(cost: float | None) -> str:
    """``$0.001234`` for a known cost, ``unknown`` for None (never ``$0``)."""
    if cost is None:
        return "unknown"
    return f"${cost:.6f}"

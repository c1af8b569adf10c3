"""The mix configuration (YAML), validated with pydantic: sources, quotas, dedupe, filters, generation.

`load_config(path)` returns a `MixConfig` or raises `DataError` naming the file, the source (by its
name) and the field. Relative source paths are relative to the config file's directory.
"""

from __future__ import annotations

import enum
import math
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from sglfleet.data._adapters import DEFAULT_FIELD, Format
from sglfleet.data._categories import CATEGORIES
from sglfleet.data._errors import DataError
from sglfleet.data._sources import SourceType, detect_type

__all__ = ["MixConfig", "load_config", "parse_config"]

AUTO = "auto"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_SHARE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%\s*$")


class Shortfall(enum.StrEnum):
    ERROR = "error"  # a source with fewer prompts than its quota is an error
    FILL = "fill"  # the missing prompts are taken from the other sources, in proportion to their quotas


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Quota(_Strict):
    """A count of prompts, or a share of `total`."""

    count: int | None = Field(None, ge=0)
    share: float | None = Field(None, gt=0, le=1)

    @model_validator(mode="after")
    def _one(self) -> Quota:
        if (self.count is None) == (self.share is None):
            raise ValueError("give either a count or a share")
        return self


class _ReadsAFile:
    """What a source and the existing set derive from their `path`, `format`, `field` and `type` fields
    (declared by each model, in its own order: annotations here would become fields ahead of theirs)."""

    @property
    def read_field(self) -> str:
        return self.field or DEFAULT_FIELD[self.format]

    @property
    def kind(self) -> SourceType:
        return self.type or detect_type(self.path)


class SourceConfig(_ReadsAFile, _Strict):
    name: str
    path: Path
    format: Format
    field: str | None = Field(None, description="the field the format reads; default per format")
    type: SourceType | None = Field(None, description="file type; default from the suffix (dir = HF)")
    split: str | None = Field(None, description="split of a saved HF DatasetDict")
    category: str = Field(AUTO, description="a fixed category, or auto (rule-based classifier)")
    quota: Annotated[Quota, Field(description="an integer count, or a share like '25%' or 0.25")]
    skip_bad_rows: bool = Field(False, description="count rows that do not fit the format instead of failing")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError("use letters, digits, '_', '-', '.' (it goes into custom_id)")
        return value

    @field_validator("category")
    @classmethod
    def _category(cls, value: str) -> str:
        if value != AUTO and not _NAME.match(value):
            raise ValueError(f"a category name ({', '.join(CATEGORIES)}, ...) or {AUTO!r}")
        return value

    @field_validator("quota", mode="before")
    @classmethod
    def _quota(cls, value: Any) -> Any:
        if isinstance(value, bool):
            raise ValueError("a count (integer) or a share ('25%' or a number between 0 and 1)")
        if isinstance(value, int):
            if value < 0:
                raise ValueError("a count must be >= 0")
            return {"count": value}
        if isinstance(value, float):
            if not 0 < value <= 1:
                raise ValueError("a share must be in (0, 1]; write a count as an integer")
            return {"share": value}
        if isinstance(value, str):
            match = _SHARE.match(value)
            if not match or not 0 < float(match.group(1)) <= 100:
                raise ValueError(f"{value!r} is neither a count nor a share like '25%'")
            return {"share": float(match.group(1)) / 100}
        return value


class ExistingConfig(_ReadsAFile, _Strict):
    """The existing training set: its prompts are never picked again, and its shares are reported."""

    path: Path
    format: Format = Format.SHAREGPT
    field: str | None = None
    type: SourceType | None = None
    split: str | None = None
    category_field: str | None = Field(
        "category", description="a row field holding the category; rows without it are classified"
    )


class NearDedupe(_Strict):
    enabled: bool = False
    threshold: float = Field(0.85, gt=0, lt=1, description="estimated Jaccard similarity of word 3-grams")
    num_perm: Annotated[int, Field(ge=16, le=512)] | Literal["auto"] = Field(
        "auto",
        description="MinHash permutations (bytes kept per row); auto: the fewest that reach 99.5% "
        "expected recall at threshold + 0.05",
    )

    def plan_num_perm(self) -> int | None:
        """`num_perm` for `plan_lsh`: None when auto."""
        return None if self.num_perm == "auto" else self.num_perm


class DedupeConfig(_Strict):
    exact: bool = True
    against_existing: bool = True
    near: NearDedupe = NearDedupe()


class Filters(_Strict):
    min_chars: int = Field(1, ge=0, description="shortest user text kept (characters)")
    max_chars: int = Field(32000, ge=1, description="longest user text kept (characters)")
    drop_empty: bool = True
    drop_system_only: bool = True

    @model_validator(mode="after")
    def _range(self) -> Filters:
        if self.min_chars > self.max_chars:
            raise ValueError(f"min_chars ({self.min_chars}) is above max_chars ({self.max_chars})")
        return self


class MixConfig(_Strict):
    seed: int = 0
    total: int | None = Field(None, ge=1, description="prompts in all; needed when a quota is a share")
    shortfall: Shortfall = Shortfall.ERROR
    existing: ExistingConfig | None = None
    dedupe: DedupeConfig = DedupeConfig()
    filters: Filters = Filters()
    generation: dict[str, Any] = Field(
        default_factory=dict, description="fields added to each request body (max_tokens, temperature, ...)"
    )
    url: Literal["/v1/chat/completions"] = "/v1/chat/completions"
    sources: list[SourceConfig] = Field(min_length=1)
    _origin: Path | None = PrivateAttr(None)

    @property
    def origin(self) -> Path | None:
        """The config file this was read from (an input the mix must never overwrite)."""
        return self._origin

    @field_validator("generation")
    @classmethod
    def _generation(cls, value: dict[str, Any]) -> dict[str, Any]:
        if "messages" in value:
            raise ValueError("messages come from the sources; remove 'messages' from generation")
        return value

    @model_validator(mode="after")
    def _unique_names(self) -> MixConfig:
        seen: set[str] = set()
        for source in self.sources:
            if source.name in seen:
                raise ValueError(f"two sources are named {source.name!r}")
            seen.add(source.name)
        return self

    def quotas(self) -> dict[str, int]:
        """Each source's quota as a count. Shares of `total` are rounded by largest remainder."""
        counts = {s.name: s.quota.count for s in self.sources if s.quota.count is not None}
        shares = {s.name: s.quota.share for s in self.sources if s.quota.share is not None}
        if not shares:
            if self.total is not None and sum(counts.values()) != self.total:
                raise DataError(f"the quotas add up to {sum(counts.values())} but total is {self.total}")
            return {s.name: counts[s.name] for s in self.sources}
        if self.total is None:
            named = ", ".join(repr(n) for n in shares)
            raise DataError(f"sources {named} have a share as quota: set total: (the number of prompts)")
        exact = {n: share * self.total for n, share in shares.items()}
        floors = {n: math.floor(v) for n, v in exact.items()}
        left = self.total - sum(counts.values()) - sum(floors.values())
        if not 0 <= left <= len(shares):
            raise DataError(
                f"the quotas add up to {sum(counts.values()) + sum(exact.values()):g} prompts "
                f"but total is {self.total}: make the shares and counts add up to total"
            )
        order = {s.name: i for i, s in enumerate(self.sources)}  # ties go to the source listed first
        by_remainder = sorted(shares, key=lambda n: (-round(exact[n] - floors[n], 9), order[n]))
        for name in by_remainder[:left]:
            floors[name] += 1
        counts |= floors
        return {s.name: counts[s.name] for s in self.sources}


def _resolve(path: Path, base: Path) -> Path:
    path = path.expanduser()
    return path if path.is_absolute() else base / path


def _where(loc: tuple[Any, ...], raw: Any) -> str:
    """`sources[2] ('alpaca').quota` for a pydantic error location."""
    parts: list[str] = []
    node = raw
    for item in loc:
        if isinstance(item, int):
            label = f"[{item}]"
            if isinstance(node, list) and item < len(node):
                node = node[item]
                if isinstance(node, dict) and isinstance(node.get("name"), str):
                    label += f" ({node['name']!r})"
            parts.append(label)
        else:
            parts.append(f".{item}" if parts else str(item))
            node = node.get(item) if isinstance(node, dict) else None
    return "".join(parts) or "(top level)"


def parse_config(raw: Any, origin: str = "mix config", base: Path | None = None) -> MixConfig:
    """Validate an already-parsed YAML document; `origin` names it in errors."""
    if not isinstance(raw, dict):
        raise DataError(f"{origin}: expected a mapping at the top level, found {type(raw).__name__}")
    try:
        config = MixConfig.model_validate(raw)
    except ValidationError as exc:
        lines = [f"{_where(e['loc'], raw)}: {e['msg']}" for e in exc.errors()]
        raise DataError(f"{origin}: invalid mix config:\n  " + "\n  ".join(lines)) from None
    if base is None:
        return config
    sources = [s.model_copy(update={"path": _resolve(s.path, base)}) for s in config.sources]
    update: dict[str, Any] = {"sources": sources}
    if config.existing is not None:
        update["existing"] = config.existing.model_copy(update={"path": _resolve(config.existing.path, base)})
    return config.model_copy(update=update)


def load_config(path: Path) -> MixConfig:
    """Read and validate a mix config file; relative paths in it are relative to its directory."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise DataError(f"{path}: cannot read the mix config: {exc.strerror}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise DataError(
            f"{path}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}); "
            "save the config as UTF-8"
        ) from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        problem = getattr(exc, "problem", None) or str(exc).replace("\n", " ")
        raise DataError(f"{where}: not valid YAML: {problem}") from None
    config = parse_config(raw, str(path), path.parent)
    config._origin = path
    return config

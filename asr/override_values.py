"""Override values as text: ``section.field=value`` items read as the type of the field
they set (:func:`parse_value`), and written back (:func:`format_value`). Standard library only."""

from __future__ import annotations

from typing import Any


def format_value(value: Any) -> str:
    """``value`` as an override writes it: the inverse of :func:`parse_value`."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "none"
    if isinstance(value, (tuple, list)):
        return ",".join(format_value(item) for item in value)
    return repr(value) if isinstance(value, float) else str(value)


def parse_value(raw: str, kind: str, name: str) -> Any:
    """``raw`` read as ``kind``: bool, int, float, str, ``Optional[...]`` of one of them
    (``none`` / ``null`` / empty give None) or ``Tuple[int|str, ...]`` (comma separated,
    optionally in brackets as YAML writes a list: ``a,b`` or ``[a, b]``)."""
    kind = kind.replace(" ", "")
    try:
        if kind.startswith("Optional["):
            if raw.lower() in ("none", "null", "~", ""):
                return None
            return parse_value(raw, kind[len("Optional["):-1], name)
        if kind.startswith(("Tuple[", "tuple[")):
            item_kind = kind[kind.index("[") + 1:].split(",")[0]
            if raw.startswith("[") and raw.endswith("]"):
                raw = raw[1:-1]
            elif raw.startswith("[") or raw.endswith("]"):
                raise ValueError(raw)  # one bracket only: not a list
            return tuple(parse_value(v.strip(), item_kind, name) for v in raw.split(",") if v.strip())
        if kind == "bool":
            lowered = raw.lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        if kind == "int":
            return int(raw)
        if kind == "float":
            return float(raw)
        return raw
    except ValueError:
        raise ValueError(f"cannot read {name}={raw!r} as {kind}") from None


__all__ = ["parse_value", "format_value"]

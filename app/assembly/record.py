"""What an assembly built: each part once, in order, and a check that nothing was assigned
into a part after it was built (`Built.changed`).

Every part is registered as it is constructed (`Built.part`). Its attributes are noted
then, and the attributes of the helpers it built for itself (an object of this project
held by an attribute, a few levels deep); at the end of the assembly they must be the
same objects. A genuine cycle is closed by one typed `set_…` call, declared with
`Built.closed` where it is made; anything else that changed is an assignment after
construction, which `python -m app.assembly --graph` and the tests report.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")

_DEPTH = 3  # how deep a part's own helpers are followed (turns.tools.approval_rules)
_OURS = ("app.", "channels.")


def _ours(value: Any) -> bool:
    return type(value).__module__.startswith(_OURS) and hasattr(value, "__dict__")


def _attributes(
    obj: Any, depth: int = _DEPTH, path: str = "", seen: set[int] | None = None
) -> dict[str, int]:
    """`path.to.attribute` → the id of the object it holds, through the part's own helpers."""
    seen = seen if seen is not None else set()
    if id(obj) in seen or not hasattr(obj, "__dict__"):
        return {}
    seen.add(id(obj))
    found: dict[str, int] = {}
    for name, value in vars(obj).items():
        here = f"{path}{name}"
        found[here] = id(value)
        if depth > 1 and _ours(value):
            found.update(_attributes(value, depth - 1, here + ".", seen))
    return found


def _values(obj: Any, depth: int = _DEPTH, seen: set[int] | None = None) -> Iterator[Any]:
    """What a part's attributes hold, through the part's own helpers (not through parts)."""
    seen = seen if seen is not None else set()
    if id(obj) in seen or not hasattr(obj, "__dict__"):
        return
    seen.add(id(obj))
    for value in vars(obj).values():
        yield from _held(value)
        if depth > 1 and _ours(value):
            yield from _values(value, depth - 1, seen)


def _held(value: Any) -> Iterator[Any]:
    """The objects an attribute holds: itself, a bound method's owner, a container's items."""
    yield value
    owner = getattr(value, "__self__", None)
    if owner is not None:
        yield owner
    if isinstance(value, list | tuple | set | frozenset):
        yield from value
    elif isinstance(value, dict):
        yield from value.values()


@dataclass
class Built:
    """The parts of one assembly, by name, in the order they were built."""

    parts: dict[str, Any] = field(default_factory=dict)
    _noted: dict[str, dict[str, int]] = field(default_factory=dict)
    _closed: list[tuple[str, str]] = field(default_factory=list)  # (part, attribute path)

    def part(self, name: str, obj: T) -> T:
        """Register `obj`, just constructed, as the part `name`."""
        if name in self.parts:
            raise ValueError(f"the part {name!r} is built twice")
        for other, built in self.parts.items():
            if built is obj:
                raise ValueError(f"{name!r} is the part {other!r} again")
        self.parts[name] = obj
        self._noted[name] = _attributes(obj)
        return obj

    def closed(self, name: str, attribute: str) -> None:
        """The part `name`'s `attribute` was set by a `set_…` call that closes a cycle."""
        self._closed.append((name, attribute))

    def changed(self) -> list[str]:
        """`part.attribute` paths assigned after their part was built (but declared closings)."""
        allowed = set(self._closed)
        found = []
        for name, obj in self.parts.items():
            now = _attributes(obj)
            for path, before in self._noted[name].items():
                if now.get(path) != before and not any(
                    name == part and (path == attr or path.startswith(attr + ".")) for part, attr in allowed
                ):
                    found.append(f"{name}.{path}")
            found += [f"{name}.{path}" for path in now.keys() - self._noted[name].keys()]
        return found

    def holds(self, name: str) -> list[str]:
        """The other parts that the part `name` holds (its constructor arguments, mostly)."""
        ids = {id(v): n for n, v in self.parts.items()}
        names: list[str] = []
        # Another part is not walked into: what it holds is its own line.
        seen = {i for n, i in ((n, id(v)) for n, v in self.parts.items()) if n != name}
        for held in _values(self.parts[name], seen=seen):
            found = ids.get(id(held))
            if found is not None and found != name and found not in names:
                names.append(found)
        return names

    def graph(self) -> str:
        """One line a part, in build order: its name, its class, the parts it holds."""
        lines = []
        for name, obj in self.parts.items():
            kind = f"{type(obj).__module__}.{type(obj).__qualname__}"
            held = ", ".join(self.holds(name)) or "-"
            lines.append(f"{name:<16} {kind}\n{'':<16}   ← {held}")
        for part, attribute in self._closed:
            lines.append(f"cycle closed: {part}.{attribute} (set_…)")
        changed = self.changed()
        lines.append("assigned after construction: " + (", ".join(changed) if changed else "nothing"))
        return "\n".join(lines)

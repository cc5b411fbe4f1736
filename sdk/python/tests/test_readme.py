"""The README's "Types" list is the code's: every public call and attribute of each class it
lists, with the type the code annotates (a README type may name a base class of the code's, as
``threading.Event`` for the lost signal). The asyncio guards mirror the sync ones."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import re
import threading
import typing
from pathlib import Path
from typing import Dict, Tuple

import httpx

import lease_proxy_client as lpc
from lease_proxy_client import aio, liveness, aio_liveness

README = Path(__file__).resolve().parents[1] / "README.md"
NAMES: Dict[str, object] = {
    **{name: getattr(lpc, name) for name in lpc.__all__},
    "httpx": httpx,
    "threading": threading,
    "asyncio": asyncio,
    "LostEvent": liveness.LostEvent,
    "AsyncLostEvent": aio_liveness.AsyncLostEvent,
    "_Acquiring": aio._Acquiring,
    **{name: getattr(typing, name) for name in ("Optional", "List", "Dict", "Any", "Iterator")},
}


def readme_types() -> Dict[str, Dict[str, str]]:
    """Class -> member -> type, from the python block of the "Types" section."""
    text = README.read_text()
    section = text.split("## Types\n", 1)[1].split("\n## ", 1)[0]
    block = section.split("```python\n", 1)[1].split("```", 1)[0]
    classes: Dict[str, Dict[str, str]] = {}
    current = None
    for line in block.splitlines():
        line = line.split("  #", 1)[0].rstrip()
        if m := re.fullmatch(r"class (\w+):", line):
            current = classes.setdefault(m.group(1), {})
        elif m := re.fullmatch(r"    (\w+): (.+)", line):
            current[m.group(1)] = m.group(2)
        elif m := re.fullmatch(r"    (?:async )?def (\w+)\(.*\) -> (.+)", line):
            current[m.group(1)] = m.group(2)
    return classes


def public(cls: type) -> Dict[str, object]:
    """The public members of ``cls`` with their annotated types (unresolved strings)."""
    if dataclasses.is_dataclass(cls):
        return {f.name: f.type for f in dataclasses.fields(cls)}
    lost = typing.get_args(getattr(cls, "__orig_bases__", (None,))[0])
    out: Dict[str, object] = {}
    for name, member in inspect.getmembers(cls):
        if name.startswith("_") and name not in ("__next__", "__anext__"):
            continue
        if isinstance(member, property):
            kind = member.fget.__annotations__.get("return")
            out[name] = lost[0] if kind == "LostT" and lost else kind
        elif callable(member):
            out[name] = inspect.signature(member).return_annotation
    return out


def resolve(kind: object) -> object:
    if not isinstance(kind, str):
        return kind
    kind = kind.strip().strip("'\"")
    if m := re.fullmatch(r"_Acquiring\[(\w+)\]", kind):  # awaitable, or `async with`
        kind = m.group(1)
    return eval(kind, {}, NAMES)  # noqa: S307 - names of this package and typing only


def same(readme: str, code: object) -> bool:
    wanted, got = resolve(readme), resolve(code)
    if isinstance(wanted, type) and isinstance(got, type):
        return issubclass(got, wanted)
    return wanted == got


def test_the_readme_states_every_public_type_as_the_code_annotates_it() -> None:
    documented = readme_types()
    listed = {"Client", "Lease", "Session", "EventStream", "AsyncClient", "Grant", "Renewal", "Holding", "Event"}
    assert listed <= set(documented)
    for name, members in documented.items():
        code = public(NAMES[name])
        assert set(members) == set(code), f"{name}: README {sorted(members)} != code {sorted(code)}"
        for member, kind in members.items():
            assert same(kind, code[member]), f"{name}.{member}: README says {kind}, code {code[member]}"


def test_the_asyncio_guards_mirror_the_sync_ones() -> None:
    pairs: Tuple[Tuple[type, type], ...] = (
        (lpc.Lease, lpc.AsyncLease),
        (lpc.Session, lpc.AsyncSession),
        (lpc.EventStream, lpc.AsyncEventStream),
    )
    twin = {
        "Lease": "AsyncLease",
        "Session": "AsyncSession",
        "LostEvent": "AsyncLostEvent",
        "__next__": "__anext__",
        "close": "aclose",
    }
    for sync, async_ in pairs:
        code = public(async_)
        for member, kind in public(sync).items():
            member = member if member in code else twin.get(member, member)
            assert member in code, f"{async_.__name__} has no {member}"
            kind = getattr(kind, "__name__", kind)
            assert same(twin.get(str(kind).strip("'"), str(kind)), code[member]), (async_.__name__, member)
        assert issubclass(resolve(code["lost"]), asyncio.Event) if "lost" in code else True

"""How ``Monkey`` delegates a method to one of its parts (``Reruns``, ``Sweeps``,
``Tracking``...), the part's module imported only when the method is first looked up:
`monkey run` loads none of the parts it does not call."""

from __future__ import annotations

import functools

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, Concatenate, ParamSpec, TypeVar

    _P = ParamSpec("_P")
    _R = TypeVar("_R")


class Later:
    """A part's class named where ``Monkey`` delegates to it, imported on first use: `monkey
    run` loads none of the parts it does not call (sweeps, tracking, logs, disk...)."""

    def __init__(self, module: str, qualname: str) -> None:
        self.module, self.qualname = module, qualname

    def __getattr__(self, name: str) -> Later:
        return Later(self.module, f"{self.qualname}.{name}")

    def load(self) -> Any:
        import importlib

        found = importlib.import_module(self.module)
        for name in self.qualname.split("."):
            found = getattr(found, name)
        return found


def _call(
    part: str, method: Callable[Concatenate[Any, _P], _R]
) -> Callable[Concatenate[Any, _P], _R]:
    @functools.wraps(method)
    def call(self: Any, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        return method(getattr(self, part), *args, **kwargs)

    return call


class _Delegate:
    """The method of ``Monkey`` a ``_to`` names, made on first look-up (from the class or
    an instance: help() and inspect see the method itself) and then set on the class."""

    def __init__(self, part: str, method: Later) -> None:
        self.part, self.method = part, method

    def __set_name__(self, owner: type, name: str) -> None:
        self.owner, self.name = owner, name

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        call = _call(self.part, self.method.load())
        setattr(self.owner, self.name, call)
        return call if obj is None else call.__get__(obj, owner)


def to(part: str, method: Callable[Concatenate[Any, _P], _R]) -> Callable[Concatenate[Any, _P], _R]:
    """A ``Monkey`` method that calls METHOD of its part ``self.<PART>`` (a ``Reruns``,
    ``Sweeps``, ``Tracking``...), with METHOD's signature and docstring; the part's module
    is imported when the method is first looked up."""
    if isinstance(method, Later):  # (at run time only: mypy sees the classes themselves)
        return _Delegate(part, method)  # type: ignore[return-value,unused-ignore]
    return _call(part, method)

"""A call checked against the installed library's own signature, and stand-ins that check every call
the project's code makes into a library while leaving the device work out.

`bind_to_installed` binds a call's arguments to the real function's signature (``inspect``) and
checks each bound value against its parameter's annotation. A catch-all (``*args``, ``**kwargs``)
takes anything, so binding into one proves nothing: a value that lands there is a mismatch, unless
the real function is declared to forward its catch-alls to an implementation (``forwards``), whose
signature is bound instead. A parameter the library documents as deprecated (``deprecated``) is a
mismatch too: the next release may drop it.

`ModuleStandIn` stands in for a real module in ``sys.modules``: names resolve in the real module (a
name the library lacks fails there, as the real import would), classes listed in ``intercepted``
(and functions) come back as stand-ins (`stand_in`), whose calls, and the method calls of the objects
they construct, are bound, checked, recorded and answered by the test instead of running device
code; every other name is the real object.
"""

from __future__ import annotations

import collections.abc
import functools
import inspect
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field


class CallMismatch(AssertionError):
    """A call the installed library would reject, or takes only through a deprecated form."""


@dataclass(frozen=True)
class Deprecated:
    """The forms of one function the library documents as deprecated."""

    positional: bool = False  # passing any argument (but self) by position
    names: frozenset[str] = frozenset()  # parameters not to use at all


@dataclass(frozen=True)
class ApiCall:
    """One checked call: the real function and the arguments as its signature bound them."""

    name: str  # "BatchDecodeWithPagedKVCacheWrapper.plan"
    function: Callable[..., object]  # the real one (or the implementation it forwards to)
    bound: inspect.BoundArguments

    @property
    def arguments(self) -> dict[str, object]:
        """Parameter name -> value, defaults left out (what the caller passed)."""
        return dict(self.bound.arguments)


@dataclass
class Rules:
    """What a stand-in holds a library's calls to."""

    forwards: Mapping[Callable[..., object], Callable[..., object]] = field(default_factory=dict)
    deprecated: Mapping[Callable[..., object], Deprecated] = field(default_factory=dict)


@functools.cache
def _signature(function: Callable[..., object]) -> inspect.Signature:
    """The signature of ``function`` (of a class: its constructor's, without ``self``) with its
    annotations resolved. An annotation naming what only a type checker imports (torch's
    ``_POOL_HANDLE``) cannot be evaluated: its parameter's value goes unchecked, its binding not.
    Cached: resolved once, before a test replaces the names annotations refer to by stand-ins."""
    signature = inspect.signature(function)
    sources = [function.__init__, function.__new__] if isinstance(function, type) else [function]  # type: ignore[misc]
    hints: dict[str, object] = {}
    for source in sources:
        try:
            hints.update(typing.get_type_hints(source))
        except (NameError, TypeError, AttributeError):
            namespace = getattr(inspect.unwrap(source), "__globals__", {})
            for name, annotation in getattr(source, "__annotations__", {}).items():
                try:
                    hints[name] = eval(annotation, namespace) if isinstance(annotation, str) else annotation
                except (NameError, TypeError):
                    hints[name] = inspect.Parameter.empty
    return signature.replace(parameters=[
        parameter.replace(annotation=hints.get(parameter.name, parameter.annotation))
        for parameter in signature.parameters.values()
    ], return_annotation=hints.get("return", signature.return_annotation))


def conforms(value: object, annotation: object) -> bool:
    """Whether ``value`` is what ``annotation`` allows (the forms library signatures use).

    Raises:
        CallMismatch: an annotation this checker cannot read (a string it could not resolve, a
            typing form it does not know): a check that silently passed would prove nothing.
    """
    if isinstance(annotation, ClassStandIn):  # an annotation resolved while its class is stood in for
        annotation = annotation.stands_in_for
    if annotation in (inspect.Parameter.empty, typing.Any, object):
        return True
    if annotation is None or annotation is type(None):
        return value is None
    if isinstance(annotation, typing.TypeVar):
        return True
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(conforms(value, arg) for arg in args)
    if origin is typing.Literal:
        return value in args
    if origin is tuple:
        if not isinstance(value, tuple):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(conforms(item, args[0]) for item in value)
        return not args or (len(value) == len(args) and all(conforms(v, a) for v, a in zip(value, args)))
    if origin in (list, collections.abc.Sequence, collections.abc.Iterable):
        return isinstance(value, origin) and all(conforms(item, args[0]) for item in value) if args else \
            isinstance(value, origin)
    if origin in (dict, collections.abc.Mapping):
        return isinstance(value, origin) and all(conforms(k, args[0]) and conforms(v, args[1])
                                                 for k, v in value.items())  # type: ignore[attr-defined]
    if origin is collections.abc.Callable:
        return callable(value)
    if annotation is float:  # PEP 484: an int is acceptable where a float is annotated
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is complex:
        return isinstance(value, (int, float, complex)) and not isinstance(value, bool)
    if isinstance(annotation, type):
        if isinstance(value, InstanceStandIn):  # a stand-in is an object of the class it stands in for
            return issubclass(value.stands_in_for, annotation)
        return isinstance(value, annotation)
    raise CallMismatch(f"cannot check a value against the annotation {annotation!r}")


def bind_to_installed(name: str, function: Callable[..., object], args: tuple[object, ...],
                      kwargs: Mapping[str, object], rules: Rules) -> ApiCall:
    """Bind a call to the installed ``function`` and check it (module docstring).

    Args:
        name: how the failure names the call.
        function: the real function (for a method: the function on the class; ``args`` then starts
            with the instance).
        args, kwargs: what the project's code passed.
        rules: the library's forwarding and deprecations.
    Returns:
        The call as bound.
    Raises:
        CallMismatch: the real signature rejects it, a value lands in a catch-all, a value is not
            what its parameter's annotation allows, or the call uses a deprecated form.
    """
    target = rules.forwards.get(function, function)
    signature = _signature(target)
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError as exc:
        raise CallMismatch(f"{name}{signature} rejects this call: {exc}") from None
    for parameter_name, value in bound.arguments.items():
        parameter = signature.parameters[parameter_name]
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            raise CallMismatch(f"{name}: {value!r} lands in its catch-all *{parameter_name}, where any value binds: "
                               f"pass what it names")
        if not conforms(value, parameter.annotation):
            raise CallMismatch(f"{name}: {parameter_name}={_brief(value)} is not {parameter.annotation!r}")
    deprecated = rules.deprecated.get(function)
    if deprecated is not None:
        num_positional = len(args) - (next(iter(signature.parameters), "") == "self")
        if deprecated.positional and num_positional:
            raise CallMismatch(f"{name}: positional arguments are deprecated in the installed version; pass keywords")
        used = deprecated.names & set(bound.arguments)
        if used:
            raise CallMismatch(f"{name}: {sorted(used)} are deprecated in the installed version")
    return ApiCall(name, target, bound)


def _brief(value: object) -> str:
    shape = getattr(value, "shape", None)
    return f"<{type(value).__name__} shape={tuple(shape)}>" if shape is not None else repr(value)


# answers a checked call the stand-in does not run: the call, and the stand-in object it was made on
# (None for a function)
Answer = Callable[[ApiCall, "InstanceStandIn | None"], object]


class InstanceStandIn:
    """An object of an intercepted class: each method call is checked, recorded and answered."""

    def __init__(self, cls: type, constructed: ApiCall | None, recorder: CallRecorder):
        self.stands_in_for = cls
        self._recorder = recorder
        self.calls: list[ApiCall] = [constructed] if constructed else []  # this object's calls, construction first

    def __getattr__(self, name: str) -> Callable[..., object]:
        cls = self.stands_in_for
        real = getattr(cls, name)  # AttributeError: the installed class has no such member
        if not callable(real):
            raise AttributeError(f"the stand-in for {cls.__name__} holds no state: {name} is not a method")

        def checked(*args: object, **kwargs: object) -> object:
            call = self._recorder.check(f"{cls.__name__}.{name}", real, (self, *args), kwargs)
            self.calls.append(call)
            return self._recorder.answer(call, self)

        return checked

    # `with` looks these up on the type, not through __getattr__; Python makes these calls, not the
    # project's code, so only their existence on the installed class is checked
    def __enter__(self) -> None:
        if not hasattr(self.stands_in_for, "__enter__"):
            raise CallMismatch(f"{self.stands_in_for.__name__} is not a context manager")

    def __exit__(self, *exc: object) -> None:
        return None


class ClassStandIn:
    """An intercepted class: constructing it checks the constructor's call and gives an
    `InstanceStandIn`."""

    def __init__(self, cls: type, recorder: CallRecorder):
        self.stands_in_for = cls
        self._recorder = recorder
        _signature(cls)  # resolved now, while the names its annotations use are the real ones

    def __call__(self, *args: object, **kwargs: object) -> InstanceStandIn:
        cls = self.stands_in_for
        call = self._recorder.check(f"{cls.__name__}.__init__", cls, args, kwargs)
        instance = InstanceStandIn(cls, call, self._recorder)
        self._recorder.instances.append(instance)
        return instance

    def __getattr__(self, name: str) -> object:
        return getattr(self.stands_in_for, name)


class FunctionStandIn:
    """An intercepted function: each call is checked, recorded and answered."""

    def __init__(self, function: Callable[..., object], recorder: CallRecorder):
        self._function = function
        self._recorder = recorder
        _signature(function)  # resolved now, while the names its annotations use are the real ones

    def __call__(self, *args: object, **kwargs: object) -> object:
        call = self._recorder.check(self._function.__name__, self._function, args, kwargs)
        return self._recorder.answer(call, None)


def stand_in(real: Callable[..., object], recorder: CallRecorder) -> ClassStandIn | FunctionStandIn:
    """A checking, recording stand-in for the class or function ``real``."""
    return ClassStandIn(real, recorder) if isinstance(real, type) else FunctionStandIn(real, recorder)


class CallRecorder:
    """Checks and records the calls made through its stand-ins.

    Args:
        rules: the library's forwarding and deprecations.
        answers: call name ("Class.method", or a function's name) -> what a checked call returns; a
            call whose installed annotation returns None needs none.
    """

    def __init__(self, rules: Rules, answers: Mapping[str, Answer]):
        self.rules = rules
        self.answers = answers
        self.calls: list[ApiCall] = []
        self.instances: list[InstanceStandIn] = []

    def check(self, name: str, function: Callable[..., object], args: tuple[object, ...],
              kwargs: Mapping[str, object]) -> ApiCall:
        """`bind_to_installed`, recorded."""
        call = bind_to_installed(name, function, args, kwargs, self.rules)
        self.calls.append(call)
        return call

    def answer(self, call: ApiCall, instance: InstanceStandIn | None) -> object:
        """What the stand-in returns for ``call`` (made on ``instance``; None for a function).

        Raises:
            NotImplementedError: the real function returns something and the test gave no answer.
        """
        answer = self.answers.get(call.name)
        if answer is not None:
            return answer(call, instance)
        returns = _signature(call.function).return_annotation
        if returns is None or returns is type(None):
            return None
        raise NotImplementedError(f"the stand-in has no answer for {call.name} (which returns {returns!r}): "
                                  f"give the test one")

    def named(self, name: str) -> list[ApiCall]:
        """The recorded calls of ``name`` ("Class.method")."""
        return [call for call in self.calls if call.name == name]


class ModuleStandIn(types.ModuleType):
    """A real module as the project's code sees it once installed in ``sys.modules`` (module docstring)."""

    def __init__(self, real: types.ModuleType, intercepted: frozenset[object], recorder: CallRecorder):
        super().__init__(real.__name__, real.__doc__)
        self._real = real
        self._intercepted = intercepted
        self._recorder = recorder

    def __getattr__(self, name: str) -> object:
        value = getattr(self._real, name)
        if callable(value) and value in self._intercepted:
            return stand_in(value, self._recorder)
        if isinstance(value, types.ModuleType) and value.__name__.startswith(self._real.__name__.split(".")[0]):
            return ModuleStandIn(value, self._intercepted, self._recorder)
        return value

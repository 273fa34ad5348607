"""Unpickling that builds values and never runs code it was not given: for files someone else wrote.

``load(data, allowed)`` interprets a pickle opcode by opcode (``pickletools.genops`` parses it;
Python's unpickler never sees it). A global is looked up only as an exact ``(module, qualname)``
pair in ``allowed``: nothing is imported and no dotted name is followed, so
``STACK_GLOBAL('torch.distributed.checkpoint.metadata', 'os.system')`` is refused like any unknown
name. Only an allowed global may be called (REDUCE) or instantiated (NEWOBJ); BUILD fills only an
instance of an allowed class, through that class's own ``__setstate__`` or its ``__dict__`` (no
dunder keys); the opcodes that reach objects another way (INST, OBJ, NEWOBJ_EX, the extension
registry, persistent ids, out-of-band buffers) are refused before anything is built. The same
rules as torch's ``weights_only`` unpickler, which cannot be used here: it reads only protocol-2
opcodes, and torch.distributed.checkpoint writes its index with protocol 4 (FRAME,
STACK_GLOBAL, MEMOIZE).
"""

from __future__ import annotations

import pickletools
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

Allowed = Mapping[tuple[str, str], Any]  # (module, qualname) as the pickle names it -> the object


class RefusedPickle(ValueError):
    """The pickle is malformed or needs something outside the allow-list; nothing it names ran."""


_VALUES = {  # opcode -> pushes its argument
    "INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4", "FLOAT", "BINFLOAT",
    "UNICODE", "BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8",
    "BINBYTES", "SHORT_BINBYTES", "BINBYTES8",
}
_CONSTANTS: dict[str, Callable[[], Any]] = {
    "NONE": lambda: None, "NEWTRUE": lambda: True, "NEWFALSE": lambda: False,
    "EMPTY_TUPLE": tuple, "EMPTY_LIST": list, "EMPTY_DICT": dict, "EMPTY_SET": set,
}
_MARKED: dict[str, Callable[[list[Any]], Any]] = {  # opcode -> builds from the items since MARK
    "TUPLE": tuple, "LIST": list, "FROZENSET": frozenset,
    "DICT": lambda items: dict(zip(items[::2], items[1::2], strict=True)),
}
_STRUCTURE = {
    "PROTO", "FRAME", "STOP", "MARK", "POP", "POP_MARK", "DUP", "TUPLE1", "TUPLE2", "TUPLE3",
    "APPEND", "APPENDS", "SETITEM", "SETITEMS", "ADDITEMS",
    "PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE", "GET", "BINGET", "LONG_BINGET",
    "GLOBAL", "STACK_GLOBAL", "REDUCE", "NEWOBJ", "BUILD",
}
SUPPORTED = frozenset(_VALUES | set(_CONSTANTS) | set(_MARKED) | _STRUCTURE)


def load(data: bytes, allowed: Allowed) -> Any:
    """The object pickled in ``data``, built from plain values and ``allowed`` only;
    ``RefusedPickle`` naming the first reason otherwise."""
    try:
        ops = [(op.name, arg) for op, arg, _ in pickletools.genops(data)]
    except ValueError as e:
        raise RefusedPickle(f"is not a complete pickle ({e})") from None
    unsupported = sorted({name for name, _ in ops} - SUPPORTED)
    if unsupported:
        raise RefusedPickle(f"uses pickle opcodes {', '.join(unsupported)}, which reach objects "
                            "outside the allow-list")
    names = {f"{module} {name}" for module, name in allowed}
    unknown = sorted({str(arg) for name, arg in ops if name == "GLOBAL" and arg not in names})
    if unknown:
        raise RefusedPickle(f"names {', '.join(u.replace(' ', '.', 1) for u in unknown)}")
    try:
        return _Machine(allowed).run(ops)
    except RefusedPickle:
        raise
    except Exception as e:  # a stack underflow, a missing memo, an allowed class given bad values
        raise RefusedPickle(f"is malformed ({type(e).__name__}: {str(e)[:100]})") from None


class _Machine:
    def __init__(self, allowed: Allowed):
        self.allowed = allowed
        self.objects = {id(v) for v in allowed.values()}
        self.classes = {v for v in allowed.values() if isinstance(v, type)}
        self.stack: list[Any] = []
        self.marks: list[list[Any]] = []
        self.memo: dict[int, Any] = {}

    def run(self, ops: list[tuple[str, Any]]) -> Any:
        for name, arg in ops:
            if name == "STOP":
                return self.stack.pop()
            self.step(name, arg)
        raise RefusedPickle("ends without STOP")

    def step(self, name: str, arg: Any) -> None:
        stack = self.stack
        if name in _VALUES:
            stack.append(arg)
        elif name in _CONSTANTS:
            stack.append(_CONSTANTS[name]())
        elif name in _MARKED:
            items = self.pop_mark()
            self.stack.append(_MARKED[name](items))
        elif name in ("PROTO", "FRAME"):
            pass
        elif name == "MARK":
            self.marks.append(self.stack)
            self.stack = []
        elif name == "POP":
            if stack:
                stack.pop()
            else:
                self.pop_mark()
        elif name == "POP_MARK":
            self.pop_mark()
        elif name == "DUP":
            stack.append(stack[-1])
        elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
            n = int(name[-1])
            if len(stack) < n:
                raise RefusedPickle("is malformed (stack underflow)")
            grouped = tuple(stack[-n:])
            del stack[-n:]
            stack.append(grouped)
        elif name == "APPEND":
            item = stack.pop()
            self.target(list).append(item)
        elif name == "APPENDS":
            items = self.pop_mark()
            self.target(list).extend(items)
        elif name == "SETITEM":
            value, key = stack.pop(), stack.pop()
            self.target(dict, OrderedDict)[key] = value
        elif name == "SETITEMS":
            items = self.pop_mark()
            target = self.target(dict, OrderedDict)
            for key, value in zip(items[::2], items[1::2], strict=True):
                target[key] = value
        elif name == "ADDITEMS":
            items = self.pop_mark()
            self.target(set).update(items)
        elif name in ("PUT", "BINPUT", "LONG_BINPUT"):
            self.memo[int(arg)] = stack[-1]
        elif name == "MEMOIZE":
            self.memo[len(self.memo)] = stack[-1]
        elif name in ("GET", "BINGET", "LONG_BINGET"):
            stack.append(self.memo[int(arg)])
        elif name == "GLOBAL":
            module, _, qualname = str(arg).partition(" ")
            stack.append(self.lookup(module, qualname))
        elif name == "STACK_GLOBAL":
            qualname, module = stack.pop(), stack.pop()
            stack.append(self.lookup(module, qualname))
        elif name == "REDUCE":
            args, func = stack.pop(), stack.pop()
            if id(func) not in self.objects or not callable(func) or type(args) is not tuple:
                raise RefusedPickle(f"calls {_name(func)}, which is not on the allow-list")
            stack.append(func(*args))
        elif name == "NEWOBJ":
            args, cls = stack.pop(), stack.pop()
            if cls not in self.classes or type(args) is not tuple:
                raise RefusedPickle(f"creates a {_name(cls)}, which is not on the allow-list")
            stack.append(cls.__new__(cls, *args))
        elif name == "BUILD":
            state = stack.pop()
            self.build(stack[-1], state)
        else:  # SUPPORTED lists exactly the opcodes handled above
            raise RefusedPickle(f"uses the pickle opcode {name}")

    def lookup(self, module: object, qualname: object) -> Any:
        """An allowed global by its exact pair: nothing imported, no attribute followed."""
        if isinstance(module, str) and isinstance(qualname, str) and (module, qualname) in self.allowed:
            return self.allowed[(module, qualname)]
        raise RefusedPickle(f"names {module!s:.100}.{qualname!s:.100}")

    def build(self, inst: Any, state: Any) -> None:
        """BUILD, as pickle does it, for an instance of an allowed class only."""
        cls = type(inst)
        if isinstance(inst, type) or cls not in self.classes:
            raise RefusedPickle(f"sets the state of {_name(inst)}, which is not an instance of an "
                                "allowed class")
        setstate = getattr(cls, "__setstate__", None)  # the class's own, never an instance attribute
        if setstate is not None:
            setstate(inst, state)
            return
        if type(state) is not dict or any(type(k) is not str or k.startswith("__") for k in state):
            raise RefusedPickle(f"sets {_name(inst)} from a state that is not a dict of field names")
        inst.__dict__.update(state)

    def pop_mark(self) -> list[Any]:
        items = self.stack
        self.stack = self.marks.pop()
        return items

    def target(self, *types: type) -> Any:
        if type(self.stack[-1]) not in types:
            raise RefusedPickle(f"adds items to a {_name(self.stack[-1])}")
        return self.stack[-1]


def _name(obj: object) -> str:
    if isinstance(obj, type) or callable(obj):
        return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', type(obj).__name__)}"
    return type(obj).__name__

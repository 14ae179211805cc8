"""Python object reprs, as some frameworks record a tool's result (Semantic Kernel writes `str()` of its content
objects), read back as data without evaluating anything.

`TextContent(inner_content=TextContent(type='text', text='...'), text='...')` is a Python expression; its syntax
tree gives each call's class name and keyword values. Enum reprs (`<AuthorRole.USER: 'user'>`) are no expression
and become their value first. Only literals are read: names, calls and containers become plain data, anything
else None. Large or deeply nested text is refused (None), so a hostile result costs bounded time and memory.
"""

from __future__ import annotations

import ast
import re
from typing import Any

MAX_REPR_CHARS = 256 * 1024
MAX_DEPTH = 32
CLASS_KEY = "__class__"
_ENUM = re.compile(r"<[A-Za-z_][\w.]*: ('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|-?\d+)>")


def read_repr(text: str) -> Any:
    """The data of a repr: a call as a dict of its keywords plus `CLASS_KEY`, lists, dicts and literals; None when
    the text is no repr this reads."""
    if len(text) > MAX_REPR_CHARS:
        return None
    try:
        tree = ast.parse(_ENUM.sub(r"\1", text.strip()), mode="eval")
        return _value(tree.body, 0)
    except (SyntaxError, ValueError, RecursionError, MemoryError, _TooDeep):
        return None


class _TooDeep(Exception):
    pass


def _value(node: ast.AST, depth: int) -> Any:
    if depth > MAX_DEPTH:
        raise _TooDeep
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.List | ast.Tuple | ast.Set):
        return [_value(item, depth + 1) for item in node.elts]
    if isinstance(node, ast.Dict):
        pairs = ((_value(k, depth + 1) if k is not None else None, v) for k, v in zip(node.keys, node.values,
                                                                                     strict=True))
        return {k: _value(v, depth + 1) for k, v in pairs if isinstance(k, str | int | float | bool | None)}
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name | ast.Attribute):
        name = node.func.id if isinstance(node.func, ast.Name) else node.func.attr
        out: dict[str, Any] = {CLASS_KEY: name}
        out.update((kw.arg, _value(kw.value, depth + 1)) for kw in node.keywords if kw.arg)
        return out
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant):
        return -node.operand.value if isinstance(node.operand.value, int | float) else None
    return None

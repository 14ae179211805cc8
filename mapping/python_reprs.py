"""Python object reprs, as some frameworks record a tool's result (Semantic Kernel writes `str()` of its content
objects), read back as data without evaluating anything.

`TextContent(inner_content=TextContent(type='text', text='...'), text='...')` is a Python expression; its syntax
tree gives each call's class name and keyword values. Enum reprs (`<AuthorRole.USER: 'user'>`) are no expression:
outside string literals they become their value first. Only literals of JSON's kinds are read (str, int, float,
bool, None): names, calls and containers become plain data, anything else None. The text is bounded in length and
in structure (brackets and commas, an upper bound of the tree's size), so a hostile result costs little work.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from typing import Any

MAX_REPR_CHARS = 256 * 1024
MAX_STRUCTURE = 8192  # brackets, commas and operators outside string literals: what bounds the tree ast.parse builds
MAX_DEPTH = 32
CLASS_KEY = "__class__"
_STRINGS = re.compile(r"'(?:[^'\\\n]|\\.)*'|\"(?:[^\"\\\n]|\\.)*\"")
_STRUCTURE = re.compile(r"[(\[{,<>=+\-*/%&|^~@:]")


class _Unreadable(Exception):
    """Deeper than MAX_DEPTH."""


def read_repr(text: str) -> Any:
    """The data of a repr: a call as a dict of its keywords plus `CLASS_KEY`, lists, dicts and literals; None when
    the text is no repr this reads, or is too large to read."""
    if len(text) > MAX_REPR_CHARS or "\x00" in text \
            or len(_STRUCTURE.findall(_STRINGS.sub("", text))) > MAX_STRUCTURE:
        return None
    try:
        try:
            tree = ast.parse(text.strip(), mode="eval")
        except SyntaxError:
            if "<" not in text:
                return None
            tree = ast.parse(_enum_values(text.strip()), mode="eval")
        return _value(tree.body, 0)
    except Exception:  # noqa: BLE001 - whatever the parser or tokenizer raises on odd text: no repr read
        return None


def _enum_values(text: str) -> str:
    """`<Name.MEMBER: value>` outside string literals replaced by its value, token by token (a `<` inside a
    string, as in a tool's text, is left alone)."""
    starts = [0]
    for line in io.StringIO(text):
        starts.append(starts[-1] + len(line))
    tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    out, last, i = [], 0, 0
    while i < len(tokens):
        token = tokens[i]
        if token.type == tokenize.OP and token.string == "<":
            j = i + 1
            while j < len(tokens) and (tokens[j].type == tokenize.NAME or tokens[j].string == "."):
                j += 1
            sign = "-" if j + 1 < len(tokens) and tokens[j + 1].string == "-" else ""
            k = j + 1 + len(sign)  # the value's token
            if k + 1 < len(tokens) and j > i + 1 and tokens[j].string == ":" \
                    and tokens[k].type in (tokenize.STRING, tokenize.NUMBER) and tokens[k + 1].string == ">" \
                    and not (sign and tokens[k].type == tokenize.STRING):
                begin = starts[token.start[0] - 1] + token.start[1]
                end = starts[tokens[k + 1].end[0] - 1] + tokens[k + 1].end[1]
                out += [text[last:begin], sign + tokens[k].string]
                last, i = end, k + 2
                continue
        i += 1
    out.append(text[last:])
    return "".join(out)


def _value(node: ast.AST, depth: int) -> Any:
    if depth > MAX_DEPTH:
        raise _Unreadable
    if isinstance(node, ast.Constant):
        return node.value if isinstance(node.value, str | int | float | bool | None) else None
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
        value = node.operand.value
        return -value if isinstance(value, int | float) and not isinstance(value, bool) else None
    return None

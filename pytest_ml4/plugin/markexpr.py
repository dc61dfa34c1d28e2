"""Which marker names a ``-m`` expression selects, by pytest's documented grammar, without pytest's private parser.

pytest documents the grammar of ``-m`` (``expr: and_expr ('or' and_expr)*``, ``and_expr: not_expr ('and'
not_expr)*``, ``not_expr: 'not' not_expr | '(' expr ')' | ident kwargs?``) but its parser lives in the private
``_pytest.mark.expression``. The plugin only asks "would this expression select a check carrying marker X?" for
its session header, so it evaluates the expression itself; marker keyword arguments (``mark(key=value)``) match
the marker whatever their values, as the header cannot know a check's arguments.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

#: pytest's identifier characters (``\w : + - . [ ] \ /``), a keyword-argument group in parentheses, or a
#: parenthesis.
_TOKEN = re.compile(r"\s*(?:(?P<ident>[\w:+\-.\[\]\\/]+)(?P<kwargs>\((?:[^()'\"]|'[^']*'|\"[^\"]*\")*=[^()]*\))?"
                    r"|(?P<paren>[()]))")
_KEYWORDS = ("and", "or", "not")


class MarkExpressionError(ValueError):
    """The expression does not follow pytest's ``-m`` grammar (pytest reports it itself)."""


def _tokens(expr: str) -> list[str]:
    out, pos = [], 0
    while pos < len(expr.rstrip()):
        m = _TOKEN.match(expr, pos)
        if m is None:
            raise MarkExpressionError(f"unexpected character at column {pos + 1}: {expr[pos:pos + 10]!r}")
        out.append(m.group("ident") or m.group("paren"))
        pos = m.end()
    return out


def compile_markexpr(expr: str) -> Callable[[str], bool]:
    """A predicate: does ``expr`` select a check carrying only the marker named by the argument?"""
    tokens = _tokens(expr)
    pos = 0

    def peek() -> str | None:
        return tokens[pos] if pos < len(tokens) else None

    def take(expected: str | None = None) -> str:
        nonlocal pos
        token = peek()
        if token is None or (expected is not None and token != expected):
            raise MarkExpressionError(f"expected {expected or 'an identifier'} at token {pos + 1} of {expr!r}")
        pos += 1
        return token

    def chain(keyword: str, operand: Callable[[], Callable[[str], bool]],
              combine: Callable[[Iterable[bool]], bool]) -> Callable[[str], bool]:
        """``operand (keyword operand)*``: ``or`` chains of ``and`` chains of ``not_expr``."""
        parts = [operand()]
        while peek() == keyword:
            take(keyword)
            parts.append(operand())
        return lambda name: combine(p(name) for p in parts)

    def or_expr() -> Callable[[str], bool]:
        return chain("or", and_expr, any)

    def and_expr() -> Callable[[str], bool]:
        return chain("and", not_expr, all)

    def not_expr() -> Callable[[str], bool]:
        if peek() == "not":
            take("not")
            inner = not_expr()
            return lambda name: not inner(name)
        if peek() == "(":
            take("(")
            inner = or_expr()
            take(")")
            return inner
        ident = take()
        if ident in _KEYWORDS or ident in ("(", ")"):
            raise MarkExpressionError(f"unexpected {ident!r} in {expr!r}")
        return lambda name: name == ident

    if not tokens:
        return lambda name: False  # pytest: an empty expression selects nothing
    predicate = or_expr()
    if peek() is not None:
        raise MarkExpressionError(f"unexpected {peek()!r} after a complete expression in {expr!r}")
    return predicate

"""A small shell reader for the scripts and unit lines that launch vLLM, Dynamo and aiperf.

It does what a linter needs and no more: joins ``\\`` line continuations, drops comments, splits a line into
simple commands on ``;``, ``&&``, ``||``, ``|`` and ``&``, splits words with POSIX quoting (so a
``--speculative-config '{"method": "dspark"}'`` value stays one word), keeps ``$(...)`` and backtick
substitutions as single words, tracks ``NAME=value`` assignments and the variables bound by enclosing
``for`` loops, and expands ``$VAR`` / ``${VAR}`` from known values while leaving unknown ones as written.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

_ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.DOTALL)
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?[-=+?][^}]*)?\}|\$([A-Za-z_][A-Za-z0-9_]*)")
# Words that open/close compound commands; the command after them is still a command.
_LEADERS = {"then", "else", "do", "{", "!", "time", "exec", "env", "nohup", "sudo"}
_DECLARE = {"export", "local", "readonly", "declare"}
# Things whose output differs on every run: a variable built from one of them names a fresh directory.
_RUN_UNIQUE = re.compile(r"\$\(\s*(date|uuidgen|mktemp|hostname)\b|`\s*(date|uuidgen|mktemp)\b|\$RANDOM|\$\{RANDOM\}"
                         r"|\$\$|/proc/sys/kernel/random/uuid|\$\{?(HOSTNAME|POD_NAME|POD_UID|JOB_UID)\b")


@dataclass
class ShellCommand:
    """One simple command: its words (quotes removed), start line, and loop variables in scope."""

    argv: list[str]
    line: int
    loop_vars: frozenset[str] = frozenset()


@dataclass
class ShellScript:
    """The commands of a script plus the variables it assigns (last assignment wins)."""

    commands: list[ShellCommand] = field(default_factory=list)
    variables: dict[str, str] = field(default_factory=dict)
    run_unique_vars: set[str] = field(default_factory=set)

    def expand(self, word: str, extra: dict[str, str] | None = None) -> str:
        return expand_vars(word, {**self.variables, **(extra or {})})


def expand_vars(word: str, env: dict[str, str]) -> str:
    """``$VAR`` / ``${VAR}`` replaced by known values; unknown references stay as written."""
    def sub(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        return env[name] if name in env else m.group(0)
    return _VAR.sub(sub, word)


def referenced_vars(word: str) -> set[str]:
    return {m.group(1) or m.group(2) for m in _VAR.finditer(word)}


def is_run_unique(value: str, unique_vars: set[str] | frozenset[str]) -> bool:
    """True when ``value`` differs on every run (a timestamp, uuid, temp dir, pod name, or a variable of one)."""
    return bool(_RUN_UNIQUE.search(value)) or bool(referenced_vars(value) & set(unique_vars))


def logical_lines(text: str) -> list[tuple[int, str]]:
    """Lines with ``\\``-continuations joined, each with the 1-based number of its first physical line."""
    out: list[tuple[int, str]] = []
    buf: list[str] = []
    start = 0
    for no, raw in enumerate(text.splitlines(), start=1):
        if not buf:
            start = no
        stripped = raw.rstrip()
        if stripped.endswith("\\") and not stripped.endswith("\\\\"):
            buf.append(stripped[:-1])
            continue
        buf.append(raw)
        out.append((start, " ".join(part.strip() for part in buf)))
        buf = []
    if buf:
        out.append((start, " ".join(part.strip() for part in buf)))
    return out


def _segments(line: str) -> list[str]:
    """Split a logical line on unquoted command separators and drop an unquoted ``#`` comment.

    ``$(...)`` / backtick substitutions are kept intact (their separators do not split the outer line).
    """
    segments: list[str] = []
    cur: list[str] = []
    quote: str | None = None
    depth = 0
    i = 0
    prev = " "
    while i < len(line):
        ch = line[i]
        if quote:
            cur.append(ch)
            if ch == quote and (quote == "'" or prev != "\\"):
                quote = None
        elif ch in ("'", '"'):
            quote = ch
            cur.append(ch)
        elif ch == "$" and line[i + 1:i + 2] == "(":
            depth += 1
            cur.append("$(")
            i += 1
        elif ch == ")" and depth:
            depth -= 1
            cur.append(ch)
        elif depth:
            cur.append(ch)
        elif ch == "#" and prev in " \t;&|":
            break
        elif ch == "&" and (prev in "<>" or line[i + 1:i + 2] == ">"):
            cur.append(ch)  # a redirection (2>&1, &>file), not a separator
        elif ch in ";&|":
            segments.append("".join(cur))
            cur = []
            while i + 1 < len(line) and line[i + 1] in ";&|":
                i += 1
        else:
            cur.append(ch)
        prev = ch
        i += 1
    segments.append("".join(cur))
    return [s.strip() for s in segments if s.strip()]


_SUBST = re.compile(r"\$\((?:[^()]|\([^()]*\))*\)|`[^`]*`")


def split_words(segment: str) -> list[str]:
    """POSIX word splitting with ``$(...)``/backticks protected; raises ``ValueError`` on unbalanced quotes."""
    saved: list[str] = []

    def protect(m: re.Match[str]) -> str:
        saved.append(m.group(0))
        return f"\x00{len(saved) - 1}\x00"

    protected = _SUBST.sub(protect, segment)
    lexer = shlex.shlex(protected, posix=True)
    lexer.whitespace_split = True
    lexer.commenters = ""
    words = list(lexer)
    return [re.sub(r"\x00(\d+)\x00", lambda m: saved[int(m.group(1))], w) for w in words]


def parse_script(text: str, base_env: dict[str, str] | None = None,
                 unique_vars: set[str] | None = None) -> ShellScript:
    """Read a script (or a single command line) into commands and variable assignments."""
    script = ShellScript(variables=dict(base_env or {}), run_unique_vars=set(unique_vars or ()))
    loops: list[str | None] = []
    for lineno, line in logical_lines(text):
        for segment in _segments(line):
            try:
                words = split_words(segment)
            except ValueError:
                continue
            _consume(words, lineno, script, loops)
    return script


def _consume(words: list[str], lineno: int, script: ShellScript, loops: list[str | None]) -> None:
    while words and words[0] in _LEADERS:
        words = words[1:]
    if not words:
        return
    head = words[0]
    if head in ("for", "select") and len(words) >= 2:
        loops.append(words[1])
        return
    if head in ("while", "until"):
        loops.append(None)
        return
    if head == "done":
        if loops:
            loops.pop()
        return
    if head in ("if", "elif", "fi", "case", "esac", "}"):
        return
    if head in _DECLARE:
        words = [w for w in words[1:] if not w.startswith("-")]
        for w in words:
            _assign(w, script)
        return
    # Leading NAME=value words are assignments (for the command, or for the shell when nothing follows).
    while words and _ASSIGN.match(words[0]):
        _assign(words[0], script)
        words = words[1:]
    if not words:
        return
    inner = _shell_c(words)
    if inner is not None:
        # `bash -c '...'` (a unit's ExecStart, a container command): read the inner script in place.
        for sub_line, sub in logical_lines(inner):
            for segment in _segments(sub):
                try:
                    _consume(split_words(segment), lineno + sub_line - 1, script, loops)
                except ValueError:
                    continue
        return
    scope = frozenset(v for v in loops if v)
    script.commands.append(ShellCommand(argv=words, line=lineno, loop_vars=scope))


def _shell_c(words: list[str]) -> str | None:
    """The script of ``sh|bash|dash|zsh [-opts] -c SCRIPT``, or None for any other command."""
    if words[0].rsplit("/", 1)[-1] not in ("sh", "bash", "dash", "zsh"):
        return None
    for i, w in enumerate(words[1:], start=1):
        if w == "-c" or (w.startswith("-") and not w.startswith("--") and w.endswith("c")):
            return words[i + 1] if i + 1 < len(words) else None
    return None


def _assign(word: str, script: ShellScript) -> None:
    m = _ASSIGN.match(word)
    if not m:
        return
    name, value = m.group(1), m.group(2)
    if is_run_unique(value, script.run_unique_vars):
        script.run_unique_vars.add(name)
    script.variables[name] = expand_vars(value, script.variables)


def find_program(argv: list[str]) -> tuple[str, int] | None:
    """Which known program a command runs and the index where its own arguments start.

    Recognised: ``vllm serve``, ``python -m dynamo.vllm``, ``python -m dynamo.frontend``,
    ``python -m vllm.entrypoints.openai.api_server``, ``aiperf profile``.
    """
    for i, word in enumerate(argv):
        base = word.rsplit("/", 1)[-1]
        nxt = argv[i + 1] if i + 1 < len(argv) else ""
        if base == "vllm" and nxt == "serve":
            return "vllm serve", i + 2
        if base == "aiperf" and nxt == "profile":
            return "aiperf profile", i + 2
        if word == "-m" and nxt in ("dynamo.vllm", "dynamo.frontend", "vllm.entrypoints.openai.api_server"):
            prog = {"vllm.entrypoints.openai.api_server": "vllm serve"}.get(nxt, nxt)
            return prog, i + 2
    return None

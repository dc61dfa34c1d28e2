"""Tool selection and schema-valid argument generation for the simulator's deterministic "model".

The simulated model picks the tool whose name/description words best match the user's words, and fills the
arguments from the tool's JSON schema: required properties always, optional ones when the prompt mentions them,
values taken from the prompt where they appear (proper nouns for location-like strings, numbers for numeric
fields, enum members named in the prompt), deterministic defaults otherwise.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

_WORD = re.compile(r"[A-Za-z][A-Za-z0-9']*")
_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?")
_QUOTED = re.compile(r"[\"“']([^\"”']{1,80})[\"”']")
_PROPER = re.compile(r"\b[A-Z][a-zà-ÿ]+(?:[ -][A-Z][a-zà-ÿ]+)*\b")
_IDENT = re.compile(r"\b[A-Z0-9]*[A-Z][A-Z0-9]*(?:-[A-Z0-9]+)+\b|\b[A-Z]+\d+[A-Z0-9]*\b")
_ID_HINTS = ("sku", "id", "code", "ref", "number", "serial")


def words(text: str) -> list[str]:
    """Lower-case words of ``text`` with ``snake_case``/``camelCase`` identifiers split."""
    spaced = re.sub(r"([a-z])([A-Z])", r"\1 \2", text).replace("_", " ").replace("-", " ")
    return [w.lower() for w in _WORD.findall(spaced)]


def _stem(w: str) -> str:
    # Crude plural folding so "forecasts" matches "forecast".
    return w[:-1] if len(w) > 3 and w.endswith("s") else w


@dataclass
class PromptFacts:
    """What the argument generator may take from the prompt."""

    text: str
    stop_words: frozenset[str]
    numbers: list[float] = field(default_factory=list)
    quoted: list[str] = field(default_factory=list)
    proper_nouns: list[str] = field(default_factory=list)
    identifiers: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, text: str, stop_words: frozenset[str], exclude: set[str]) -> PromptFacts:
        nums = [float(n) for n in _NUMBER.findall(text)]
        quoted = _QUOTED.findall(text)
        proper: list[str] = []
        for m in _PROPER.finditer(text):
            name = m.group(0)
            # A capitalised single first word of a sentence is usually not a name ("What", "Please", "Say").
            at_start = m.start() == 0 or text[: m.start()].rstrip()[-1:] in ".?!:"
            if name.lower() in stop_words or name.lower() in exclude or (at_start and " " not in name):
                continue
            if name not in proper:
                proper.append(name)
        idents = list(dict.fromkeys(_IDENT.findall(text)))
        return cls(text=text, stop_words=stop_words, numbers=nums, quoted=quoted, proper_nouns=proper,
                   identifiers=idents)


_SENTENCE_STARTS = {"what", "please", "get", "tell", "show", "find", "call", "use", "give", "check", "how", "can",
                    "could", "would", "compare", "look", "book", "search", "list", "send", "create", "convert",
                    "i", "is", "are", "the", "and", "also", "then", "weather", "what's", "whats"}


def tool_name(tool: dict[str, Any]) -> str:
    return str((tool.get("function") or {}).get("name", ""))


def score_tool(tool: dict[str, Any], prompt_words: set[str], stop_words: frozenset[str]) -> int:
    """How many of the tool's name/description/parameter words occur in the prompt."""
    fn = tool.get("function") or {}
    vocab = words(fn.get("name", "")) + words(fn.get("description", "") or "")
    props = ((fn.get("parameters") or {}).get("properties") or {})
    vocab += [w for p in props for w in words(p)]
    name_words = {_stem(w) for w in words(fn.get("name", "")) if w not in stop_words}
    score = 0
    for w in {_stem(w) for w in vocab if w not in stop_words}:
        if w in prompt_words:
            score += 3 if w in name_words else 1
    return score


def pick_tool(tools: list[dict[str, Any]], prompt: str, stop_words: frozenset[str]) -> dict[str, Any] | None:
    """The best-matching tool, or None when no tool word occurs in the prompt (deterministic tie-break: order)."""
    pw = {_stem(w) for w in words(prompt) if w not in stop_words}
    best, best_score = None, 0
    for t in tools:
        s = score_tool(t, pw, stop_words)
        if s > best_score:
            best, best_score = t, s
    return best


_LOCATION_HINTS = ("city", "location", "place", "destination", "origin", "country", "town", "region", "where",
                   "from", "to", "airport")


class ArgGenerator:
    """Fills one call's arguments from a JSON schema and the prompt facts."""

    def __init__(self, facts: PromptFacts, subject: str | None) -> None:
        self.facts = facts
        self.subject = subject
        self._num_i = 0
        self._quote_i = 0
        self._noun_i = 0
        self._enum_i: dict[tuple[str, ...], int] = {}

    def object(self, schema: dict[str, Any], required_only: bool = False) -> dict[str, Any]:
        props: dict[str, Any] = schema.get("properties") or {}
        required = list(schema.get("required") or [])
        out: dict[str, Any] = {}
        subject_used = False
        for name, sub in props.items():
            wanted = name in required or (not required_only and self._mentioned(name, sub))
            if not wanted:
                continue
            use_subject = (not subject_used and self.subject is not None and name in required
                           and self._is_subject_field(name, sub))
            out[name] = self.value(sub if isinstance(sub, dict) else {}, name, use_subject)
            subject_used = subject_used or use_subject
        return out

    def _mentioned(self, name: str, schema: Any) -> bool:
        text = self.facts.text.lower()
        if any(w in text for w in words(name) if w not in self.facts.stop_words and len(w) > 2):
            return True
        if not isinstance(schema, dict):
            return False
        enum = schema.get("enum") or (schema.get("items") or {}).get("enum")
        return bool(enum) and any(str(e).lower() in text for e in enum)

    def _is_subject_field(self, name: str, schema: Any) -> bool:
        t = schema.get("type") if isinstance(schema, dict) else None
        return t in ("string", None) and not (isinstance(schema, dict) and schema.get("enum"))

    def value(self, schema: dict[str, Any], name: str, use_subject: bool = False) -> Any:
        if "const" in schema:
            return schema["const"]
        for key in ("anyOf", "oneOf", "allOf"):
            if schema.get(key):
                first = next((s for s in schema[key] if isinstance(s, dict) and s.get("type") != "null"),
                             schema[key][0])
                return self.value(first, name, use_subject)
        if schema.get("enum"):
            return self._enum(schema["enum"])
        typ = schema.get("type", "string")
        if isinstance(typ, list):
            typ = next((t for t in typ if t != "null"), "string")
        if typ == "object":
            return self.object(schema)
        if typ == "array":
            return self._array(schema, name)
        if typ == "integer":
            return int(self._number(schema, integer=True))
        if typ == "number":
            return self._number(schema, integer=False)
        if typ == "boolean":
            return any(w in self.facts.text.lower() for w in words(name) if len(w) > 2)
        if typ == "null":
            return None
        return self._string(schema, name, use_subject)

    def _enum_mentions(self, values: list[Any]) -> list[Any]:
        """Enum members named in the prompt, in the order they appear."""
        text = self.facts.text.lower()
        found = [(m.start(), v) for v in values
                 for m in [re.search(r"(?<![a-z0-9_])" + re.escape(str(v).lower()) + r"(?![a-z0-9_])", text)] if m]
        return [v for _, v in sorted(found, key=lambda x: x[0])]

    def _enum(self, values: list[Any]) -> Any:
        # Successive fields over the same enum take successive mentions ("250 EUR in USD": from EUR, to USD).
        mentions = self._enum_mentions(values)
        key = tuple(str(v) for v in values)
        i = self._enum_i.get(key, 0)
        self._enum_i[key] = i + 1
        if not mentions:
            return values[0]
        return mentions[min(i, len(mentions) - 1)]

    def _number(self, schema: dict[str, Any], integer: bool) -> float:
        lo = schema.get("minimum", schema.get("exclusiveMinimum"))
        hi = schema.get("maximum", schema.get("exclusiveMaximum"))
        if self._num_i < len(self.facts.numbers):
            v = self.facts.numbers[self._num_i]
            self._num_i += 1
        else:
            v = float(lo) if lo is not None else 1.0
        if "exclusiveMinimum" in schema and v <= schema["exclusiveMinimum"]:
            v = schema["exclusiveMinimum"] + 1
        if "exclusiveMaximum" in schema and v >= schema["exclusiveMaximum"]:
            v = schema["exclusiveMaximum"] - 1
        if lo is not None and v < lo:
            v = float(lo)
        if hi is not None and v > hi:
            v = float(hi)
        if integer:
            return round(v)
        return int(v) if float(v).is_integer() else v

    def _array(self, schema: dict[str, Any], name: str) -> list[Any]:
        items = schema.get("items") if isinstance(schema.get("items"), dict) else {"type": "string"}
        lo = int(schema.get("minItems", 1))
        hi = schema.get("maxItems")
        out: list[Any] = []
        if items.get("enum"):
            out = self._enum_mentions(items["enum"])
        elif items.get("type", "string") == "string" and self.facts.proper_nouns:
            out = list(self.facts.proper_nouns)
        while len(out) < max(lo, 1):
            out.append(self.value(items, name))
        if hi is not None:
            out = out[: int(hi)]
        if schema.get("uniqueItems"):
            seen: list[Any] = []
            for v in out:
                if v not in seen:
                    seen.append(v)
            out = seen
        return out

    def _string(self, schema: dict[str, Any], name: str, use_subject: bool) -> str:
        fmt = schema.get("format")
        if fmt == "date":
            return "2026-11-30"
        if fmt == "date-time":
            return "2026-11-30T12:00:00Z"
        if fmt == "email":
            return "user@example.com"
        if fmt in ("uri", "url"):
            return "https://example.com"
        if use_subject and self.subject:
            return self.subject
        lname = name.lower()
        if self.facts.identifiers and any(h in words(lname) for h in _ID_HINTS):
            return self.facts.identifiers[0]
        nouns = [n for n in self.facts.proper_nouns if n != self.subject] if self.subject else self.facts.proper_nouns
        if any(h in lname for h in _LOCATION_HINTS) and nouns:
            # Successive location-like fields take successive names ("from Paris to Berlin").
            self._noun_i += 1
            return nouns[min(self._noun_i - 1, len(nouns) - 1)]
        if self._quote_i < len(self.facts.quoted):
            self._quote_i += 1
            return self.facts.quoted[self._quote_i - 1]
        if nouns:
            return nouns[0]
        text = " ".join(w for w in words(self.facts.text) if w not in self.facts.stop_words)[:40].strip()
        value = text or name
        min_len = int(schema.get("minLength", 0))
        return value.ljust(min_len, "x")


def subjects_for(tool: dict[str, Any], facts: PromptFacts) -> list[str | None]:
    """One entry per call: several proper nouns for a tool whose first required field is a plain string
    ("weather in Paris and Rome") give parallel calls; otherwise one call."""
    params = (tool.get("function") or {}).get("parameters") or {}
    props = params.get("properties") or {}
    required = list(params.get("required") or [])
    plain = [r for r in required if isinstance(props.get(r), dict)
             and props[r].get("type", "string") == "string" and not props[r].get("enum")
             and not props[r].get("format")]
    if len(plain) == 1 and plain[0] == (required[0] if required else None) and len(facts.proper_nouns) >= 2:
        return list(facts.proper_nouns[:4])
    return [None]


def generate_calls(tool: dict[str, Any], facts: PromptFacts) -> list[dict[str, Any]]:
    """Argument objects for the calls the model makes to ``tool``."""
    params = (tool.get("function") or {}).get("parameters") or {"type": "object", "properties": {}}
    return [ArgGenerator(facts, subject).object(params) for subject in subjects_for(tool, facts)]

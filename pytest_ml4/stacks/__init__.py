"""The serving stacks: one adapter per value of a target's ``serving.stack``, behind one protocol
(:class:`pytest_ml4.stacks.base.Stack`). Checks ask ``stack_for(target)``; none tests a stack's name.

Adding a stack: its row in ``pytest_ml4/data/stacks/stacks.yaml``, a module here with an ``adapter()`` factory, and
its entry in :data:`REGISTRY` (docs/decisions/stacks.md, "Adding a stack").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from pytest_ml4.stacks import dynamo, litellm, vllm
from pytest_ml4.stacks.base import Stack, StackError

if TYPE_CHECKING:
    from pytest_ml4.target.model import Target

#: ``serving.stack`` value -> the factory of its adapter.
REGISTRY: dict[str, Callable[[], Stack]] = {
    vllm.NAME: vllm.adapter,
    litellm.NAME: litellm.adapter,
    dynamo.NAME: dynamo.adapter,
}
#: The target field the stack is named in (discovery offers it; errors name it).
STACK_FIELD = "serving.stack"


def stack_named(name: str, where: str = STACK_FIELD) -> Stack:
    """The adapter of the stack ``name``; :class:`StackError` of one line naming ``where`` for an unknown one."""
    factory = REGISTRY.get(name)
    if factory is None:
        raise StackError(f"{where}: unknown stack {name!r}; known stacks: {', '.join(REGISTRY)}")
    return factory()


def stack_for(target: Target) -> Stack:
    """The adapter of the stack serving ``target``."""
    return stack_named(target.serving.stack, f"{target.path or target.name}: field '{STACK_FIELD}'")


def token_counters() -> tuple[str, ...]:
    """The generated-token counter of every stack's metrics URL (for a URL whose stack is not known)."""
    return tuple(dict.fromkeys(factory().token_counter for factory in REGISTRY.values()))


def stack_markers() -> dict[str, str]:
    """Every marker some stack serves -> how a skip names the stack serving it."""
    return {marker: label for factory in REGISTRY.values() for marker, label in factory().markers.items()}


__all__ = ["REGISTRY", "STACK_FIELD", "Stack", "StackError", "stack_for", "stack_markers", "stack_named", "token_counters"]

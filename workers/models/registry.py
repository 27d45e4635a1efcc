"""Finds a model class by backend name or import path and builds it from a model policy."""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from typing import Any

from config.errors import ConfigError
from config.settings import ModelPolicy
from workers.models.base import Model

log = logging.getLogger(__name__)

BUILTIN_BACKENDS = {
    "synthetic": "workers.models.synthetic:SyntheticModel",
    "embedding": "workers.models.embedding:EmbeddingModel",
    "openai": "workers.models.openai_http:OpenAIModel",
}


def load_class(backend: str) -> type[Any]:
    """Resolves ``backend``: a built-in name or ``package.module:ClassName``.

    Raises:
        ConfigError: the name is not built in and does not import.
    """
    path = BUILTIN_BACKENDS.get(backend, backend)
    module_name, _, class_name = path.partition(":")
    if not class_name:
        raise ConfigError(
            f"unknown backend {backend!r}: use one of {sorted(BUILTIN_BACKENDS)} or 'module:Class'"
        )
    try:
        module = importlib.import_module(module_name)
        return getattr(module, class_name)  # type: ignore[no-any-return]
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"cannot load backend {backend!r}: {exc}") from exc


def build_model(name: str, policy: ModelPolicy, device: str) -> Model:
    """Builds and sets up the model ``name`` on ``device``.

    Raises:
        ConfigError: the backend cannot be found, built, or set up.
    """
    cls = load_class(policy.backend)
    try:
        model = cls(**policy.options)
        model.setup(device)
    except Exception as exc:
        raise ConfigError(f"model {name!r} ({policy.backend}) failed to set up: {exc}") from exc
    if not isinstance(model, Model):
        raise ConfigError(f"model {name!r}: {policy.backend} lacks setup/predict/version")
    return model


def cost_function(policy: ModelPolicy) -> Callable[[Any], int]:
    """How the batcher prices one input: when batches are formed by cost, the backend's
    ``cost(item)`` on an instance built from the policy's options (never set up: it must be
    cheap and load nothing heavy); otherwise 1 for every input. An input whose cost cannot be
    computed costs 1: the model's own validation answers it.

    Raises:
        ConfigError: costs are asked for, and the backend reports none.
    """
    if not policy.uses_costs:
        return lambda _item: 1
    cost = token_counter(policy)
    if cost is None:
        raise ConfigError(
            f"{policy.backend} has no cost(item): max_batch_cost and group_by_cost need one"
        )
    return cost


def token_counter(policy: ModelPolicy) -> Callable[[Any], int] | None:
    """The backend's ``cost(item)`` (e.g. an input's tokens), on an instance built from the
    policy's options but never set up; None when the backend counts none.

    Raises:
        ConfigError: the backend has ``cost`` but cannot price a probe input.
    """
    cls = load_class(policy.backend)
    if not callable(getattr(cls, "cost", None)):
        return None
    try:
        model = cls(**policy.options)
        model.cost("a probe input")
    except Exception as exc:
        raise ConfigError(f"cannot price inputs with {policy.backend}: {exc}") from exc

    def cost(item: Any) -> int:
        try:
            return max(1, int(model.cost(item)))
        except Exception as exc:
            log.debug("no cost for an input of %s: %s", policy.backend, exc)
            return 1

    return cost

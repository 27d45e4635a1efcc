"""Finds a model class by backend name or import path and builds it from a model policy."""

from __future__ import annotations

import importlib
from typing import Any

from config.errors import ConfigError
from config.settings import ModelPolicy
from workers.models.base import Model

BUILTIN_BACKENDS = {
    "synthetic": "workers.models.synthetic:SyntheticModel",
    "embedding": "workers.models.embedding:EmbeddingModel",
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

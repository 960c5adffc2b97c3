"""Name -> component registries, so that pipelines can be written as YAML/JSON.

Every component family (samplers, scorers, aggregators, policies) owns one :class:`Registry`.
An implementation registers itself with its pydantic config class, whose ``name`` field (a
``Literal`` with a default) is the registry key: the name is written once, in the config. So
``registry.build(config)`` or ``registry.build({"name": "projected_loo", ...})`` rebuilds the
component.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict

T = TypeVar("T")


class ComponentConfig(BaseModel):
    """Base of every component config: frozen, named, strict about unknown fields and types.

    Strict types: a boolean is not a number (``budget: true`` and YAML ``budget: yes`` are
    errors, not 1), a string is not a number (``"64"`` is an error), an integer is a float.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    name: str


C = TypeVar("C", bound=ComponentConfig)


class Registry(Generic[T]):
    """A family of components, each found by its registry name."""

    def __init__(self, family: str) -> None:
        self.family = family
        self._entries: dict[str, tuple[type[ComponentConfig], Callable[[Any], T]]] = {}

    def register(self, config: type[C]) -> Callable[[type[T]], type[T]]:
        """Class decorator: register ``cls`` under ``config``'s ``name``; ``cls(config_instance)`` builds it."""
        name = config.model_fields["name"].default
        if not isinstance(name, str) or not name:
            raise TypeError(f"{config.__name__}.name needs a default: the {self.family}'s registry name")

        def decorator(cls: type[T]) -> type[T]:
            if name in self._entries:
                raise ValueError(f"{self.family} {name!r} is already registered")
            self._entries[name] = (config, cls)
            return cls

        return decorator

    def names(self) -> list[str]:
        return sorted(self._entries)

    def config_class(self, name: str) -> type[ComponentConfig]:
        return self._lookup(name)[0]

    def parse(self, spec: ComponentConfig | Mapping[str, Any] | str) -> ComponentConfig:
        """A validated config from a config object, a mapping with ``name``, or a bare name."""
        if isinstance(spec, ComponentConfig):
            self._lookup(spec.name)
            return spec
        if isinstance(spec, str):
            spec = {"name": spec}
        if not isinstance(spec, Mapping):
            raise ValueError(
                f"{self.family} must be a registry name, a mapping with a 'name' or a config, "
                f"got {type(spec).__name__} {spec!r}; known: {self.names()}"
            )
        if "name" not in spec:
            raise ValueError(f"{self.family} spec needs a 'name'; known: {self.names()}")
        if not isinstance(spec["name"], str):
            raise ValueError(f"{self.family} name must be a string, got {spec['name']!r}; known: {self.names()}")
        config_cls, _ = self._lookup(spec["name"])
        return config_cls.model_validate(dict(spec))

    def build(self, spec: ComponentConfig | Mapping[str, Any] | str) -> T:
        config = self.parse(spec)
        return self._lookup(config.name)[1](config)

    def _lookup(self, name: str) -> tuple[type[ComponentConfig], Callable[[Any], T]]:
        if name not in self._entries:
            raise ValueError(f"unknown {self.family} {name!r}; known: {self.names()}")
        return self._entries[name]

"""Finding plugins and the providers they bring.

Plugins are loaded from the ``onnxrt.providers`` entry-point group, each load wrapped
so that a plugin which fails to import becomes *unavailable, with its reason* and the
host keeps working. ``ONNXRT_PLUGINS`` controls automatic loading: unset loads every
installed plugin, ``none`` (or ``0``) loads none, and a comma-separated list of entry
point names loads only those.
"""

from __future__ import annotations

import importlib.metadata as md
import logging
import os
import threading
from dataclasses import dataclass
from typing import Any

import pluggy

from . import hookspecs
from ..errors import EPFail, InvalidArgument
from .provider import ExecutionProvider

__all__ = [
    "ENTRY_POINT_GROUP",
    "ProviderRegistry",
    "ProviderInfo",
    "UnknownProvider",
    "plugin_manager",
    "provider_registry",
    "get_available_providers",
    "get_all_providers",
    "get_provider_info",
    "reset",
]

ENTRY_POINT_GROUP = "onnxrt.providers"
ENV_VAR = "ONNXRT_PLUGINS"
logger = logging.getLogger("onnxrt")


class UnknownProvider(InvalidArgument, RuntimeError):
    """A provider name that no installed plugin brings. It is an ``InvalidArgument`` and,
    as onnxruntime raises it, a ``RuntimeError``."""


@dataclass
class ProviderInfo:
    """What ``get_provider_info()`` reports about one installed provider."""

    name: str
    aliases: tuple[str, ...]
    priority: int
    available: bool
    reason: str
    distribution: str
    version: str
    details: str = ""

    def as_dict(self) -> dict[str, Any]:
        """The fields as a plain dict."""
        return dict(self.__dict__)


@dataclass
class _BrokenPlugin:
    entry_point: str
    distribution: str
    version: str
    reason: str


class ProviderRegistry:
    """Provider classes by name; what ``onnxrt_register_providers`` receives."""

    def __init__(self) -> None:
        self._classes: dict[str, type[ExecutionProvider]] = {}
        self._origin: dict[str, str] = {}
        self.broken: list[_BrokenPlugin] = []
        self._current_plugin = "<builtin>"
        self._current_dist: tuple[str, str] = ("", "")

    def add_provider(self, cls: type[ExecutionProvider]) -> None:
        """Register an :class:`ExecutionProvider` subclass."""
        if not (isinstance(cls, type) and issubclass(cls, ExecutionProvider)):
            raise TypeError(f"{cls!r} is not an ExecutionProvider subclass")
        if not cls.name:
            raise TypeError(f"{cls.__name__} has no provider name")
        if cls.name in self._classes and self._classes[cls.name] is not cls:
            raise EPFail(
                f"two plugins register provider {cls.name!r}: {self._origin[cls.name]} and "
                f"{self._current_plugin}; uninstall one, or limit loading with {ENV_VAR}"
            )
        if cls.distribution is None and self._current_dist[0]:
            cls.distribution = self._current_dist
        self._classes[cls.name] = cls
        self._origin[cls.name] = self._current_plugin

    def classes(self) -> list[type[ExecutionProvider]]:
        """Every registered class, in default priority order (highest first)."""
        return sorted(self._classes.values(), key=lambda c: (-c.priority, c.name))

    def lookup(self, name: str) -> type[ExecutionProvider] | None:
        """Find a class by name or alias (case-insensitive for aliases)."""
        if name in self._classes:
            return self._classes[name]
        low = name.lower()
        for c in self._classes.values():
            if low == c.name.lower() or low in (a.lower() for a in c.aliases):
                return c
        return None

    def names(self) -> list[str]:
        """Names of every registered class."""
        return [c.name for c in self.classes()]


_lock = threading.RLock()
_pm: pluggy.PluginManager | None = None
_registry: ProviderRegistry | None = None
#: id(plugin) -> provider names that plugin added through register_plugin
_runtime_providers: dict[int, list[str]] = {}


def _allowed_entry_points() -> set[str] | None:
    raw = os.environ.get(ENV_VAR)
    if raw is None or raw.strip() == "":
        return None
    if raw.strip().lower() in ("none", "0", "off", "false"):
        return set()
    return {x.strip() for x in raw.split(",") if x.strip()}


def plugin_manager() -> pluggy.PluginManager:
    """The process-wide plugin manager, with installed plugins loaded."""
    global _pm, _registry
    with _lock:
        if _pm is not None:
            return _pm
        pm = pluggy.PluginManager("onnxrt")
        pm.add_hookspecs(hookspecs)
        reg = ProviderRegistry()
        allowed = _allowed_entry_points()
        eps = sorted(md.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name)
        for ep in eps:
            if allowed is not None and ep.name not in allowed:
                continue
            dist = getattr(ep, "dist", None)
            dname = dist.metadata["Name"] if dist is not None else ""
            dver = dist.version if dist is not None else ""
            try:
                plugin = ep.load()
            except BaseException as e:  # noqa: BLE001 - any failure makes it unavailable
                if isinstance(e, (KeyboardInterrupt, SystemExit)):
                    raise
                reason = f"plugin {ep.name!r} failed to import: {type(e).__name__}: {e}"
                logger.warning(reason)
                reg.broken.append(_BrokenPlugin(ep.name, dname, dver, reason))
                continue
            if pm.is_registered(plugin):
                continue
            pm.register(plugin, name=ep.name)
            reg._current_plugin = f"{ep.name} ({dname} {dver})".strip()
            reg._current_dist = (dname, dver)
            try:
                plugin_impls = pm.subset_hook_caller("onnxrt_register_providers", [
                    p for p in pm.get_plugins() if p is not plugin
                ])
                plugin_impls(registry=reg)
            except EPFail:
                raise
            except Exception as e:  # noqa: BLE001
                reason = f"plugin {ep.name!r} failed to register: {type(e).__name__}: {e}"
                logger.warning(reason)
                reg.broken.append(_BrokenPlugin(ep.name, dname, dver, reason))
        reg._current_plugin = "<registered at run time>"
        reg._current_dist = ("", "")
        _pm, _registry = pm, reg
        return pm


def register_plugin(plugin, name: str | None = None) -> None:
    """Register a plugin object in this process (tests, notebooks, embedded use).

    Its providers are added at once; its kernel and transformer hooks apply to
    registries built from now on.
    """
    pm = plugin_manager()
    reg = provider_registry()
    before = dict(reg._classes), dict(reg._origin)
    pm.register(plugin, name=name)
    label = pm.get_name(plugin) or repr(plugin)
    reg._current_plugin = f"{label} (registered at run time)"
    try:
        caller = pm.subset_hook_caller("onnxrt_register_providers", [p for p in pm.get_plugins() if p is not plugin])
        caller(registry=reg)
    except BaseException:
        # a plugin that fails to register leaves nothing behind: no hooks, no providers
        pm.unregister(plugin)
        reg._classes, reg._origin = before
        raise
    finally:
        reg._current_plugin = "<registered at run time>"
    _runtime_providers[id(plugin)] = [n for n in reg._classes if n not in before[0]]
    ExecutionProvider._registries.clear()
    from .. import optimizer

    optimizer.reset_transformer_registry()


def unregister_plugin(plugin) -> None:
    """Remove a plugin registered with :func:`register_plugin`, and its providers."""
    pm = plugin_manager()
    pm.unregister(plugin)
    reg = provider_registry()
    added = set(_runtime_providers.pop(id(plugin), ()))
    for name in list(reg._classes):
        cls = reg._classes[name]
        if name in added or getattr(plugin, cls.__name__, None) is cls:
            del reg._classes[name]
    ExecutionProvider._registries.clear()
    from .. import optimizer

    optimizer.reset_transformer_registry()


def provider_registry() -> ProviderRegistry:
    """The process-wide provider registry."""
    plugin_manager()
    assert _registry is not None
    return _registry


def reset() -> None:
    """Forget loaded plugins, so the next call discovers them again (tests use this)."""
    global _pm, _registry
    with _lock:
        _pm = None
        _registry = None
        _runtime_providers.clear()
        ExecutionProvider._registries.clear()
        from .. import optimizer

        optimizer.reset_transformer_registry()


def _availability(cls: type[ExecutionProvider]) -> str | None:
    try:
        return cls.is_available()
    except Exception as e:  # noqa: BLE001 - a broken check means unavailable
        return f"availability check raised {type(e).__name__}: {e}"


def get_all_providers() -> list[str]:
    """Names of every installed provider, usable or not, in onnxruntime's order: the
    device providers by default priority, then ``CPUExecutionProvider`` last (the
    provider that runs whatever the others leave)."""
    names = provider_registry().names()
    return [n for n in names if n != "CPUExecutionProvider"] + [n for n in names if n == "CPUExecutionProvider"]


def get_available_providers() -> list[str]:
    """Names of the usable providers, in default priority order."""
    return [c.name for c in provider_registry().classes() if _availability(c) is None]


def get_provider_info() -> list[dict[str, Any]]:
    """For every installed provider (and every plugin that failed to load): name,
    aliases, priority, available, reason, distribution, version and details (the
    provider's own one-line report, :meth:`ExecutionProvider.details`)."""
    out = []
    reg = provider_registry()
    for c in reg.classes():
        why = _availability(c)
        dist, ver = c.distribution or ("", "")
        try:
            details = str(c.details() or "")
        except Exception as e:  # a provider's report must not break the listing
            details = f"details unavailable ({type(e).__name__}: {e})"
        out.append(ProviderInfo(c.name, tuple(c.aliases), c.priority, why is None, why or "", dist, ver,
                                details).as_dict())
    for b in reg.broken:
        out.append(ProviderInfo(b.entry_point, (), 0, False, b.reason, b.distribution, b.version).as_dict())
    return out


def resolve_providers(requested, provider_options=None, session_options=None, allow_fallback=False):
    """Turn the user's ``providers``/``provider_options`` into provider instances.

    ``requested`` holds names, aliases, ``(name, options)`` tuples or provider
    classes; ``None`` means every available provider in default priority order.
    The CPU provider is appended when missing, since it must run whatever is left.
    """
    reg = provider_registry()
    entries: list[tuple[type[ExecutionProvider], dict]] = []
    if requested is None:
        for c in reg.classes():
            if _availability(c) is None:
                entries.append((c, {}))
                # the CPU provider runs every node: providers ranked below it would get
                # none, so a default session does not create them
                if c.name == "CPUExecutionProvider":
                    break
        if provider_options:
            raise InvalidArgument("provider_options given without providers")
    else:
        if isinstance(requested, (str, tuple)):
            requested = [requested]
        requested = list(requested)
        if provider_options is not None and len(provider_options) != len(requested):
            raise InvalidArgument(
                f"provider_options has {len(provider_options)} entries but providers has {len(requested)}"
            )
        for i, item in enumerate(requested):
            opts = dict(provider_options[i]) if provider_options is not None else {}
            if isinstance(item, tuple):
                if len(item) != 2 or not isinstance(item[1], dict):
                    raise InvalidArgument(f"provider entry {item!r} must be (name, options_dict)")
                item, more = item
                opts.update(more)
            if isinstance(item, type) and issubclass(item, ExecutionProvider):
                cls = item
            elif isinstance(item, str):
                cls = reg.lookup(item)
                if cls is None:
                    broken = [b for b in reg.broken if b.entry_point.lower() in item.lower()]
                    hint = f" ({broken[0].reason})" if broken else ""
                    known = ", ".join(reg.names()) or "none"
                    raise UnknownProvider(
                        f"provider {item!r} is not installed{hint}; installed providers: {known} "
                        f"(Unknown Provider Type: {item})"
                    )
            else:
                raise InvalidArgument(f"provider entry {item!r} must be a name or (name, options)")
            why = _availability(cls)
            if why is not None:
                if allow_fallback:
                    logger.warning("provider %s is unavailable (%s); falling back", cls.name, why)
                    continue
                raise EPFail(f"provider {cls.name} was requested but is unavailable: {why}")
            if any(c is cls for c, _ in entries):
                raise InvalidArgument(f"provider {cls.name} is listed twice")
            entries.append((cls, opts))
    if not any(c.name == "CPUExecutionProvider" for c, _ in entries):
        cpu = reg.lookup("CPUExecutionProvider")
        if cpu is None:
            raise EPFail(
                "the CPU provider is not installed; every session needs it to run what other "
                "providers cannot (pip install onnxrt-cpu)"
            )
        entries.append((cpu, {}))
    out = []
    for cls, opts in entries:
        try:
            out.append(cls(opts, session_options))
        except (InvalidArgument, EPFail):
            raise
        except Exception as e:  # noqa: BLE001
            if allow_fallback and cls.name != "CPUExecutionProvider":
                logger.warning("provider %s failed to start (%s); falling back", cls.name, e)
                continue
            raise EPFail(f"provider {cls.name} failed to start: {type(e).__name__}: {e}") from e
    return out

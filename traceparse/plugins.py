"""The plugin manager: loads the plugins of the ``traceparse`` entry-point group.

Built-in plugins are registered through the same entry points as third-party
ones. A plugin that fails to import (or whose hook fails) is recorded as
broken (``traceparse plugins`` shows it), every command says so in one
warning line naming the plugin, its entry point and the error, and the others
keep working.

**Plugins are imported when needed** (issue 25: a fast start). The first time, every plugin is loaded and a
*plugin index* is written to the cache directory (:func:`cache_dir`): for each entry point, the hooks it
implements and the names of the commands (with their help), formats, rules and exporters it provides. Later
invocations read the index and register a plugin with pluggy only when something it provides is asked for:
``traceparse list`` imports the plugin of the ``list`` command, not the readers and rules (nor polars). The
index is keyed by the entry points, their distributions' versions, the files of their packages and the
interpreter's search path, so installing, removing or editing a plugin rebuilds it; a plugin that was broken
is tried every time. The collected objects are always the real plugins' own, in the order a full load gives.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import sys
import threading
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import pluggy

from traceparse import hookspecs
from traceparse.errors import InputError, spelled

ENTRY_POINT_GROUP = "traceparse"
hookimpl = pluggy.HookimplMarker("traceparse")


@dataclass
class PluginInfo:
    """One entry point of the ``traceparse`` group, loaded or not."""

    name: str
    module: str
    distribution: str
    version: str
    builtin: bool
    error: str | None = None

    @property
    def broken(self) -> bool:
        return self.error is not None


#: The collecting hooks whose objects are looked up by name, and the index key of their names.
NAMED_HOOKS = {"traceparse_readers": "readers", "traceparse_rules": "rules", "traceparse_exporters": "exporters",
               "traceparse_commands": "commands"}


class Registry:
    """The plugins and what they provide, looked up by name.

    ``pending`` are entry points not imported yet (a registry made from the plugin index, :func:`registry`):
    each is imported and registered the first time a hook it implements is collected (``index`` says which).
    """

    def __init__(self, pm: pluggy.PluginManager, infos: list[PluginInfo], *, pending: dict | None = None,
                 index: dict | None = None):
        self.pm = pm
        self._infos = infos
        self.warnings: list[str] = []
        #: hook name -> plugin name -> how many objects its implementation returned (filled by _collect)
        self._provided: dict[str, dict[str, int]] = {}
        self._pending: dict[str, object] = dict(pending or {})  # entry point name -> entry point, not yet loaded
        self._index: dict[str, dict] = index or {}
        self._order = {info.name: i for i, info in enumerate(infos)}
        self._info = {info.name: info for info in infos}
        self._origins: dict[int, str] = {}  # id of a collected object -> the plugin that provided it
        self._loading = threading.RLock()

    # -- loading on demand ---------------------------------------------------------------------------------
    @property
    def plugins(self) -> list[PluginInfo]:
        """Every plugin (entry point, or registered in code), each imported, with its error when broken."""
        self._load(list(self._pending))
        return self._infos

    def _load(self, names) -> None:
        """Import and register the pending entry points ``names`` (in entry-point order); one thread at a time
        (rules run at once in ``analyze`` may both ask for a hook's plugins)."""
        with self._loading:
            for name in sorted((n for n in names if n in self._pending), key=self._order.get):
                ep = self._pending.pop(name)
                info = self._info[name]
                _register(self.pm, ep, info)
                if info.broken:
                    self.warnings.append(broken_warning(info))

    def _need(self, hook_name: str) -> None:
        """Load every pending plugin that implements ``hook_name`` (all of them when the index does not say)."""
        with self._loading:
            if self._pending:
                self._load([n for n in self._pending if n not in self._index
                            or hook_name in self._index[n].get("hooks", ())])

    def providers(self, hook_name: str, name: str) -> list[str] | None:
        """The plugins the index says provide the object ``name`` of ``hook_name`` (None: it does not know)."""
        key = NAMED_HOOKS[hook_name]
        found = [p for p, entry in self._index.items() if name in [n if isinstance(n, str) else n[0]
                                                                   for n in entry.get(key, [])]]
        return found or None

    def command_list(self) -> list[tuple[str, str]]:
        """(name, help) of every command, in the order ``traceparse --help`` lists them: from the index while the
        command plugins are not all loaded (nothing is imported), else from the commands themselves."""
        if self._index and "commands" not in self.__dict__:
            listed: dict[str, str] = {}  # a name provided twice: the later plugin's, in the first one's place
            with_commands = [p for p, entry in self._index.items() if "traceparse_commands" in entry.get("hooks", ())]
            for plugin in self._hook_order("traceparse_commands", with_commands):
                for name, help_text in self._index[plugin].get("commands", []):
                    listed[name] = help_text
            return list(listed.items())
        return [(name, command.help) for name, command in self.commands.items()]

    def command(self, name: str):
        """The command called ``name`` (None when there is none), importing only the plugins that provide it."""
        providers = self.providers("traceparse_commands", name) if self._index else None
        if providers is None or "commands" in self.__dict__:
            return self.commands.get(name)
        self._load(providers)
        found = self._by_name("command", self._collect("traceparse_commands", only=set(providers)), warn=False)
        return found.get(name) or self.commands.get(name)

    def _hook_order(self, hook_name: str, plugins) -> list[str]:
        """``plugins`` in the order a full load calls their ``hook_name`` implementations (pluggy's: later
        registered first, ``tryfirst`` before, ``trylast`` after), from the index's ``tryfirst``/``trylast``."""
        def flags(p):
            entry = self._index.get(p, {})
            return hook_name in entry.get("tryfirst", ()), hook_name in entry.get("trylast", ())

        return [p for p, *_ in _call_order([(p, *flags(p)) for p in sorted(plugins, key=self._order.get)])]

    # -- collecting ----------------------------------------------------------------------------------------
    def _collect(self, hook_name: str, only: set[str] | None = None) -> list:
        """The objects every plugin's ``hook_name`` returns, in pluggy's call order (those of the plugins ``only``,
        loaded already, when given)."""
        if only is None:
            self._need(hook_name)
        hook = getattr(self.pm.hook, hook_name)
        impls = {impl.plugin_name: impl for impl in hook.get_hookimpls()}
        order = _call_order([(name, impl.tryfirst, impl.trylast)
                             for name, impl in sorted(impls.items(), key=lambda kv: self._order.get(kv[0], 1 << 30))])
        items = []
        provided = self._provided.setdefault(hook_name, {}) if only is None else {}
        for name, *_ in order:
            if only is not None and name not in only:
                continue
            impl = impls[name]
            try:
                result = impl.function()
            except Exception as exc:  # a plugin's bug must not take the others down
                self._mark_broken(impl.plugin_name, f"{hook_name} failed: {exc}")
                continue
            provided[impl.plugin_name] = len(result or [])
            for obj in result or []:
                self._origins[id(obj)] = impl.plugin_name
            items.extend(result or [])
        if only is None:
            self.__dict__.setdefault("_collected", set()).add(hook_name)
        return items

    def _mark_broken(self, plugin_name: str, error: str) -> None:
        for info in self._infos:
            if info.name == plugin_name and info.error is None:
                info.error = error
                self.warnings.append(broken_warning(info))

    def _by_name(self, kind: str, objects: list, warn: bool = True) -> dict:
        table = {}
        for obj in objects:
            if obj.name in table and warn:
                self.warnings.append(f"{kind} {obj.name!r} is provided twice; the later one wins")
            table[obj.name] = obj
        return table

    @cached_property
    def readers(self) -> dict:
        """Reader name -> :class:`traceparse.reader.Reader`."""
        return self._by_name("format", self._collect("traceparse_readers"))

    @cached_property
    def rules(self) -> dict:
        """Rule name -> :class:`traceparse.rule.Rule`."""
        return self._by_name("rule", self._collect("traceparse_rules"))

    @cached_property
    def exporters(self) -> dict:
        """Exporter name -> :class:`traceparse.exporter.Exporter`."""
        return self._by_name("exporter", self._collect("traceparse_exporters"))

    @cached_property
    def commands(self) -> dict:
        """Command name -> :class:`traceparse.command.Command`."""
        return self._by_name("command", self._collect("traceparse_commands"))

    @cached_property
    def gpu_specs(self) -> list[dict]:
        """GPU catalog entries from every plugin, later ones replacing earlier ones of the same name."""
        merged: dict[str, dict] = {}
        for spec in self._collect("traceparse_gpu_specs"):
            merged[spec["name"]] = spec
        return list(merged.values())

    @cached_property
    def gpu_spec_counts(self) -> dict[str, int]:
        """Plugin name -> how many GPU catalog entries it provides (for ``traceparse plugins``).

        Counted while :attr:`gpu_specs` collects them, so each hook runs once.
        """
        self.gpu_specs  # noqa: B018 - collects, and counts
        return dict(self._provided.get("traceparse_gpu_specs", {}))

    @cached_property
    def kernel_categories(self) -> list[tuple[str, str]]:
        """Kernel-category rows from every plugin (hook ``traceparse_kernel_categories``), in registration order."""
        return [(str(category), str(pattern)) for category, pattern in self._collect("traceparse_kernel_categories")]

    def origin(self, obj) -> str:
        """``"<distribution> <version>"`` of the plugin that provided ``obj`` (a reader, rule, ...): which code made
        what it made. A stored reading says it (:attr:`traceparse.meta.TraceMeta.reader`), so that a store read by
        an older release is read again by the newer one instead of keeping the older one's figures."""
        plugin = self._origins.get(id(obj))
        info = self._info.get(plugin) if plugin is not None else None
        if info is None:
            return "(registered in code)" if plugin is not None else "(unknown plugin)"
        return f"{info.distribution} {info.version}".strip()

    def reading_of(self, reader) -> str:
        """What names a reading by ``reader``: its name and its plugin's distribution and version
        (``"torch (traceparse 0.1.0)"``)."""
        return f"{reader.name} ({self.origin(reader)})"

    def reader(self, name: str):
        """The reader called ``name``, or an :class:`InputError` listing those there are."""
        try:
            return self.readers[name]
        except KeyError:
            said = spelled(f"unknown --format {name!r}", f"fmt={name!r}: unknown format")
            output = spelled("; --format names the input's format, --json writes the output as JSON", "")
            raise InputError(f"{said}; known formats: auto, {', '.join(sorted(self.readers))}"
                             + (output if name.strip().lower() == "json" else "")) from None

    def rule(self, name: str):
        """The rule called ``name``, or an :class:`InputError` listing those there are."""
        try:
            return self.rules[name]
        except KeyError:
            raise InputError(f"unknown rule {name!r}; known rules: {', '.join(sorted(self.rules))}") from None


def broken_warning(info: PluginInfo) -> str:
    """The one line a command prints about a plugin that failed: its name, entry point, distribution and error."""
    if info.builtin:
        origin = "built-in"
    elif info.distribution == "(registered in code)":
        origin = "registered in code"
    else:
        origin = f"from {info.distribution} {info.version}".rstrip()
    return (f"plugin {info.name!r} is left out: its entry point {info.name} = {info.module} ({origin}) failed: "
            f"{info.error}")


def _distribution_of(entry_point, known: dict | None = None) -> tuple[str, str]:
    """(distribution name, version) of an entry point; ``known`` caches them per distribution (each reading
    parses the distribution's whole METADATA file: 37 built-in entry points took 0.17 s)."""
    dist = getattr(entry_point, "dist", None)
    if dist is None:
        return "unknown", "unknown"
    if known is not None and dist in known:
        return known[dist]
    found = dist.metadata["Name"], dist.version
    if known is not None:
        known[dist] = found
    return found


def _register(pm: pluggy.PluginManager, ep, info: PluginInfo) -> None:
    """Import the entry point ``ep`` and register it; a failure is recorded in ``info.error``."""
    if pm.has_plugin(ep.name):
        info.error = f"another plugin is already registered as {ep.name!r}"
        return
    try:
        module = ep.load()
        pm.register(module, name=ep.name)
    except Exception as exc:
        info.error = f"{type(exc).__name__}: {exc}"


def _call_order(entries: list[tuple]) -> list[tuple]:
    """The order in which pluggy calls the implementations ``entries`` (``(plugin name, tryfirst, trylast)``)
    registered in the order given: later registered first, ``tryfirst`` ones before, ``trylast`` ones after
    (pluggy's own insertion rule), whatever order the plugins were imported in."""
    methods: list[tuple] = []
    for entry in entries:
        _, first, last = entry
        if last:
            methods.insert(0, entry)
        elif first:
            methods.append(entry)
        else:
            i = len(methods) - 1
            while i >= 0 and methods[i][1]:
                i -= 1
            methods.insert(i + 1, entry)
    return list(reversed(methods))


def _entry_points() -> tuple[list, list[PluginInfo]]:
    """The entry points of the group and a :class:`PluginInfo` for each (none loaded)."""
    eps = list(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))
    known: dict = {}
    infos = []
    for ep in eps:
        dist_name, version = _distribution_of(ep, known)
        infos.append(PluginInfo(ep.name, ep.value, dist_name, version, builtin=dist_name == "traceparse"))
    return eps, infos


def load_registry(extra_plugins: list | tuple = ()) -> Registry:
    """Load every plugin of the entry-point group (plus ``extra_plugins``, for tests)."""
    pm = pluggy.PluginManager("traceparse")
    pm.add_hookspecs(hookspecs)
    eps, infos = _entry_points()
    for ep, info in zip(eps, infos):
        _register(pm, ep, info)
    for plugin in extra_plugins:
        name = getattr(plugin, "__name__", None) or type(plugin).__name__
        pm.register(plugin, name=name)
        infos.append(PluginInfo(name, name, "(registered in code)", "", builtin=False))
    reg = Registry(pm, infos)
    reg.warnings.extend(broken_warning(info) for info in infos if info.broken)
    return reg


# -- the plugin index -----------------------------------------------------------------------------------------
#: Bumped when the index's layout changes.
INDEX_VERSION = 1


def cache_dir() -> Path | None:
    """Where the plugin index is kept: ``$TRACEPARSE_CACHE_DIR``, else ``$XDG_CACHE_HOME/traceparse``, else
    ``~/.cache/traceparse``; None (no index: every plugin is loaded each time) when ``$TRACEPARSE_CACHE_DIR`` is
    ``off``."""
    given = os.environ.get("TRACEPARSE_CACHE_DIR")
    if given is not None and given.strip().lower() in ("off", "0", "no", "false", ""):
        return None
    if given:
        return Path(given)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "traceparse"


def index_path() -> Path | None:
    """The plugin index of this Python environment (one file per interpreter), or None (no cache)."""
    directory = cache_dir()
    if directory is None:
        return None
    key = hashlib.sha256(f"{sys.prefix}\n{sys.executable}".encode()).hexdigest()[:16]
    return directory / f"plugin-index-{key}.json"


def fingerprint(eps: list, infos: list[PluginInfo]) -> str:
    """What the index depends on: the entry points (name, target, distribution and version), the newest
    modification time among the files of each entry point's top-level package, the interpreter, and its
    search path's directories but the first (a package installed or removed touches one; the first is the
    script's or the working directory). Computed without importing."""
    import importlib.util

    parts = [f"v{INDEX_VERSION}", sys.version, *(f"{e.name}={e.value} {i.distribution} {i.version}"
                                                  for e, i in zip(eps, infos))]
    for entry in sys.path[1:]:  # not the first: the script's directory, or the working one (python -c, -m)
        try:
            parts.append(f"{entry} {os.stat(entry or '.').st_mtime_ns}")
        except OSError:
            parts.append(f"{entry} -")
    for top in sorted({e.value.split(":")[0].split(".")[0] for e in eps}):
        try:
            spec = importlib.util.find_spec(top)
        except (ImportError, ValueError):
            spec = None
        origin = spec and (spec.submodule_search_locations or [spec.origin])
        newest = 0
        for place in list(origin or []):
            if place and os.path.isdir(place):
                for base, dirs, files in os.walk(place):
                    dirs[:] = [d for d in dirs if d != "__pycache__"]
                    for name in files:
                        if name.endswith((".py", ".toml", ".json")):
                            try:
                                newest = max(newest, os.stat(os.path.join(base, name)).st_mtime_ns)
                            except OSError:
                                pass
            elif place:
                try:
                    newest = max(newest, os.stat(place).st_mtime_ns)
                except OSError:
                    pass
        parts.append(f"{top} {newest}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def build_index(reg: Registry) -> dict[str, dict]:
    """What each loaded entry point provides: its hooks (and which are ``tryfirst``/``trylast``), and the names
    of its formats, rules, exporters and commands (with their help), as ``reg`` collected them; its error
    when broken."""
    entries: dict[str, dict] = {}
    for info in reg.plugins:
        if info.distribution == "(registered in code)":
            continue
        entry: dict = {"error": info.error, "hooks": [], "tryfirst": [], "trylast": []}
        plugin = reg.pm.get_plugin(info.name)
        if plugin is not None:
            for caller in reg.pm.get_hookcallers(plugin) or []:
                impl = next(i for i in caller.get_hookimpls() if i.plugin_name == info.name)
                entry["hooks"].append(caller.name)
                if impl.tryfirst:
                    entry["tryfirst"].append(caller.name)
                if impl.trylast:
                    entry["trylast"].append(caller.name)
        entries[info.name] = entry
    for hook_name, key in NAMED_HOOKS.items():
        getattr(reg, key)  # collected once as a whole (and its warnings), then asked plugin by plugin
        for impl in getattr(reg.pm.hook, hook_name).get_hookimpls():
            if impl.plugin_name not in entries:
                continue
            try:
                objects = impl.function() or []
            except Exception:
                continue
            entries[impl.plugin_name][key] = [[o.name, o.help] if key == "commands" else o.name for o in objects]
    return entries


def _read_index(path: Path, key: str) -> dict | None:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("fingerprint") != key or not isinstance(doc.get("plugins"), dict):
        return None
    return doc["plugins"]


def _write_index(path: Path, key: str, entries: dict) -> None:
    """Write the index atomically; a cache that cannot be written is no error (the next start loads all)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps({"fingerprint": key, "plugins": entries}), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        pass


def indexed_registry() -> Registry:
    """The registry of the installed plugins, importing them only as they are needed (the plugin index); on
    the first start, or when the plugins changed, every plugin is loaded and the index written."""
    path = index_path()
    if path is None:
        return load_registry()
    eps, infos = _entry_points()
    if len({ep.name for ep in eps}) != len(eps):  # two entry points of one name: the full load says which lost
        return load_registry()
    key = fingerprint(eps, infos)
    entries = _read_index(path, key)
    if entries is None or set(entries) != {ep.name for ep in eps}:
        reg = load_registry()
        _write_index(path, key, build_index(reg))
        return reg
    pm = pluggy.PluginManager("traceparse")
    pm.add_hookspecs(hookspecs)
    reg = Registry(pm, infos, pending={ep.name: ep for ep in eps}, index=entries)
    reg._load([name for name, entry in entries.items() if entry.get("error")])  # tried again: it may work now
    return reg


_registry: Registry | None = None


def registry() -> Registry:
    """The process-wide registry, made on first use (:func:`indexed_registry`: plugins imported when needed)."""
    global _registry
    if _registry is None:
        _registry = indexed_registry()
    return _registry


def reset_registry(extra_plugins: list | tuple = ()) -> Registry:
    """Reload the plugins, every one (tests register throwaway plugins this way)."""
    global _registry
    _registry = load_registry(extra_plugins)
    return _registry

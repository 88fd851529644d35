"""The bundled protocol stub in the forms reTHINK runtimes deploy, all made from its one source.

``stub_js/src/index.js`` is an ES module whose exports are all in one block at its end (the stub's
module test holds it to that). Each other form is the text above that block, wrapped:

- a **classic script** that defines the global ``activate`` when evaluated: what reTHINK's browser
  runtime evaluates in its Worker sandbox (dev-runtime-browser ``src/ContextServiceProvider.js``
  runs ``eval.apply(self, [sourceCode])`` and calls ``activate``), and what its catalogue
  descriptors carry as ``sourcePackage.sourceCode``;
- a **System.register module** whose default export is the stub class: what reTHINK's runtime-core
  loads since its SystemJS change (``src/runtime/Loader.js`` ``_load``: SystemJS imports
  ``…/default.ps.js`` and makes ``new result.default()``, its sandbox calls ``_start``). SystemJS
  (3.x, the version runtime-core names) loads only System.register modules and global scripts, so
  this form, not an ES module, is what ``default.ps.js`` must be;
- an **ES module whose default export is the stub class**, for loaders using native ``import()``:
  a one-line re-export of the ES module, nothing copied.
"""

from __future__ import annotations

import asyncio
import os
import re
from dataclasses import dataclass
from pathlib import Path

# The bundled stub: package data. In the repository `web/protostub.js` is a symbolic link to
# stub_js/src/index.js, the stub's one source; building the package copies the file it names, so
# an installed node serves the same text with no second copy to keep. (Not resolved here: the
# link's own path is what an installed package has.)
STUB_SOURCE = Path(__file__).parent / "web" / "protostub.js"

EXPORTS_MARKER = "\n// exports:"
# What the forms make available, as the source's exports block names it.
CLASS_NAME = "MatrixProtoStub"
ENTRY_POINT = "activate"


class StubSourceError(Exception):
    """The stub's source is not shaped as the forms need (its exports are not in one last block)."""


@dataclass(frozen=True)
class StubForms:
    module: str  # the ES module as written, default export `activate`
    script: str  # classic script defining the global `activate`
    system: str  # System.register module, default export the stub class
    # Grows whenever the source changes (its modification time, in seconds): reTHINK's runtime
    # keeps a catalogue object it has unless the catalogue offers a higher version.
    version: int


def component_module(module_url: str) -> str:
    """An ES module whose default export is the stub class, re-exported from the ES module."""
    return (
        f"export {{ {CLASS_NAME} as default, {CLASS_NAME}, {ENTRY_POINT} }} from '{module_url}';\n"
    )


_EXPORT_LINE = re.compile(r"^\s*export\b", re.MULTILINE)


def make_forms(source: str, version: int) -> StubForms:
    body, marker, exports = source.partition(EXPORTS_MARKER)
    statements = [line for line in exports.splitlines()[1:] if line.strip()]
    if (
        not marker
        or _EXPORT_LINE.search(body)
        or not all(_EXPORT_LINE.match(line) or line.startswith("//") for line in statements)
    ):
        raise StubSourceError("the stub's exports are not in one block at the end of its source")
    script = (
        "// reTHINK protocol stub for the Matrix-backed Message Node, as a classic script:\n"
        "// evaluating it defines the global `activate(url, bus, configuration)`.\n"
        "(function () {\n"
        "'use strict';\n"
        f"{body}\n"
        f"globalThis.{ENTRY_POINT} = {ENTRY_POINT};\n"
        "})();\n"
    )
    system = (
        "// reTHINK protocol stub for the Matrix-backed Message Node, as a System.register module\n"
        f"// whose default export is the stub class (`new`, then `_start(url, bus, config)`).\n"
        "System.register([], function (_export) {\n"
        "'use strict';\n"
        "return { execute: function () {\n"
        f"{body}\n"
        f"_export({{ default: {CLASS_NAME}, {CLASS_NAME}, {ENTRY_POINT} }});\n"
        "} };\n"
        "});\n"
    )
    return StubForms(module=source, script=script, system=system, version=version)


class StubFiles:
    """The forms of the stub at ``path``, made again whenever the file changes."""

    def __init__(self, path: Path = STUB_SOURCE) -> None:
        self._path = path
        self._made: tuple[tuple[int, int], StubForms] | None = None

    async def forms(self) -> StubForms | None:
        """The forms, or None when the source is not installed with this node."""
        return await asyncio.to_thread(self._read)

    def _read(self) -> StubForms | None:
        try:
            stat = os.stat(self._path)
        except FileNotFoundError:
            return None
        key = (stat.st_mtime_ns, stat.st_size)
        if self._made is None or self._made[0] != key:
            source = self._path.read_text(encoding="utf-8")
            self._made = (key, make_forms(source, int(stat.st_mtime)))
        return self._made[1]


def stub_descriptor(
    domain: str, messagingnode: str, version: int, source_package: str | None = None
) -> dict[str, object]:
    """The protocol-stub descriptor of ``domain``, in the shape reTHINK's runtimes read.

    runtime-core's Loader reads ``default.ps.json`` beside ``default.ps.js`` and passes the
    ``configuration`` (plus ``runtimeURL``) to the stub; dev-service-framework's RuntimeCatalogue
    needs the fields it checks (cguid, version, objectName, description, language,
    sourcePackageURL, messageSchemas, configuration, constraints) and, given the source package
    inside, uses it: ``sourcePackageURL`` ``/sourcePackage`` is reTHINK's mark for that.
    """
    descriptor: dict[str, object] = {
        "cguid": f"rethink-mn-protostub-{domain}",
        "version": version,
        "objectName": "default",
        "description": f"Protocol stub of {domain}: the Matrix-backed reTHINK Message Node",
        "language": "javascript",
        "signature": "",
        "sourcePackageURL": "/sourcePackage",
        "messageSchemas": [],
        "dataObjects": [],
        "configuration": {"messagingnode": messagingnode},
        # Any sandbox will do: the stub needs nothing but a WebSocket.
        "constraints": {},
        "interworking": False,
    }
    if source_package is not None:
        descriptor["sourcePackage"] = {
            "sourceCodeClassname": CLASS_NAME,
            "encoding": "utf-8",
            "sourceCode": source_package,
            "signature": "",
        }
    return descriptor

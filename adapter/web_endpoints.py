"""What the node serves over HTTP beside the stub endpoint: the bundled stub in the forms reTHINK
runtimes deploy, its descriptors where those runtimes look for them, and the demo.

reTHINK runtimes fetch a domain's protocol stub from the domain itself:

- runtime-core since its SystemJS change imports ``https://<domain>/.well-known/protocolstub/
  default.ps.js`` and reads ``default.ps.json`` beside it (``src/runtime/Loader.js`` ``_load``);
- earlier runtimes, and dev-runtime-browser's Worker sandbox, ask the domain's catalogue for the
  descriptor ``hyperty-catalogue://catalogue.<domain>/.well-known/protocolstub/default`` (served
  over https; dev-service-framework ``RuntimeCatalogue``: ``…/version`` and ``…/cguid`` first, by
  GET or by POST with the runtime's constraints) and evaluate its ``sourcePackage.sourceCode``.

The node serves all of these under its stub listener, so a domain's web server (or catalogue)
only needs to pass ``/.well-known/protocolstub/`` on to it. They are public (the stub's code and
the node's address), so any page may read them (``Access-Control-Allow-Origin: *``); which pages
may then connect is ``stub.allowed_origins``.
"""

from __future__ import annotations

import json
from pathlib import Path

from aiohttp import web

from .stub_files import StubFiles, StubForms, component_module, stub_descriptor

WEB = Path(__file__).with_name("web")
WELL_KNOWN = "/.well-known/protocolstub"
_PUBLIC = {"Access-Control-Allow-Origin": "*", "Cache-Control": "no-cache"}
# A descriptor names the node's address, which may come from the request's Host header: no
# shared cache may keep one request's answer for another.
_DESCRIPTOR = {"Access-Control-Allow-Origin": "*", "Cache-Control": "no-store"}


class WebPages:
    def __init__(self, domain: str, stub_files: StubFiles, public_url: str | None = None) -> None:
        self._domain = domain
        self._stub_files = stub_files
        self._public_url = public_url.rstrip("/") if public_url else None

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/demo", self.demo_page)
        app.router.add_get("/demo/demo.js", self.demo_script)
        app.router.add_get("/stub/protostub.js", self.stub_module)
        app.router.add_get("/stub/protostub.script.js", self.stub_script)
        app.router.add_get("/stub/protostub.component.js", self.stub_component)
        app.router.add_get(f"{WELL_KNOWN}/default.ps.js", self.stub_system_module)
        app.router.add_get(f"{WELL_KNOWN}/default.ps.json", self.stub_descriptor)
        for method in ("GET", "POST"):
            app.router.add_route(method, f"{WELL_KNOWN}/default", self.catalogue_descriptor)
            app.router.add_route(
                method,
                WELL_KNOWN + "/default/{field:version|cguid|sourcePackage}",
                self.catalogue_field,
            )

    async def demo_page(self, _request: web.Request) -> web.Response:
        html = (WEB / "demo.html").read_text(encoding="utf-8")
        # The page needs the reTHINK domain to address the node's services.
        html = html.replace(
            '<html lang="en">', f'<html lang="en" data-domain="{_escape(self._domain)}">', 1
        )
        return web.Response(text=html, content_type="text/html")

    async def demo_script(self, _request: web.Request) -> web.FileResponse:
        return web.FileResponse(WEB / "demo.js", headers={"Content-Type": "text/javascript"})

    async def stub_module(self, _request: web.Request) -> web.Response:
        return _script((await self._forms()).module)

    async def stub_script(self, _request: web.Request) -> web.Response:
        return _script((await self._forms()).script)

    async def stub_component(self, _request: web.Request) -> web.Response:
        await self._forms()
        return _script(component_module("./protostub.js"))

    async def stub_system_module(self, _request: web.Request) -> web.Response:
        return _script((await self._forms()).system)

    async def stub_descriptor(self, request: web.Request) -> web.Response:
        forms = await self._forms()
        descriptor = stub_descriptor(self._domain, self._messagingnode(request), forms.version)
        return web.json_response(descriptor, headers=_DESCRIPTOR)

    async def catalogue_descriptor(self, request: web.Request) -> web.Response:
        return web.json_response(await self._catalogue_object(request), headers=_DESCRIPTOR)

    async def catalogue_field(self, request: web.Request) -> web.Response:
        value = (await self._catalogue_object(request))[request.match_info["field"]]
        # As reTHINK's catalogue answers a field: a plain value as text, an object as JSON.
        text = json.dumps(value) if isinstance(value, dict) else str(value)
        return web.Response(text=text, content_type="application/json", headers=_DESCRIPTOR)

    async def _catalogue_object(self, request: web.Request) -> dict[str, object]:
        """The catalogue's descriptor: the classic script inside, as its source package."""
        forms = await self._forms()
        return stub_descriptor(
            self._domain, self._messagingnode(request), forms.version, forms.script
        )

    async def _forms(self) -> StubForms:
        forms = await self._stub_files.forms()
        if forms is None:
            raise web.HTTPNotFound(text="the bundled stub is not installed with this node")
        return forms

    def _messagingnode(self, request: web.Request) -> str:
        """The stub endpoint's WebSocket URL as runtimes reach it: from ``stub.public_url``, else
        from the address this request came to."""
        base = self._public_url or f"{request.scheme}://{request.host}"
        scheme, rest = base.split("://", 1)
        return f"{'wss' if scheme == 'https' else 'ws'}://{rest}/stub/connect"


def _script(text: str) -> web.Response:
    return web.Response(text=text, content_type="text/javascript", headers=_PUBLIC)


def _escape(value: str) -> str:
    return value.replace("&", "&amp;").replace('"', "&quot;").replace("<", "&lt;")

"""Static pages the node serves beside the stub endpoint: the bundled stub and the demo."""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

WEB = Path(__file__).with_name("web")
# The bundled stub, from the repository's stub_js/ (an installed wheel does not carry it; see
# the README: operators then serve stub_js/src/index.js themselves).
STUB_MODULE = Path(__file__).resolve().parents[1] / "stub_js" / "src" / "index.js"


class WebPages:
    def __init__(self, domain: str) -> None:
        self._domain = domain

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/demo", self.demo_page)
        app.router.add_get("/demo/demo.js", self.demo_script)
        app.router.add_get("/stub/protostub.js", self.stub_module)

    async def demo_page(self, _request: web.Request) -> web.Response:
        html = (WEB / "demo.html").read_text(encoding="utf-8")
        # The page needs the reTHINK domain to address the node's services.
        html = html.replace(
            '<html lang="en">', f'<html lang="en" data-domain="{_escape(self._domain)}">', 1
        )
        return web.Response(text=html, content_type="text/html")

    async def demo_script(self, _request: web.Request) -> web.FileResponse:
        return web.FileResponse(WEB / "demo.js", headers={"Content-Type": "text/javascript"})

    async def stub_module(self, _request: web.Request) -> web.StreamResponse:
        if not STUB_MODULE.exists():
            raise web.HTTPNotFound(text="the bundled stub is not installed with this node")
        return web.FileResponse(
            STUB_MODULE, headers={"Content-Type": "text/javascript", "Cache-Control": "no-cache"}
        )


def _escape(value: str) -> str:
    return value.replace("&", "&amp;").replace('"', "&quot;").replace("<", "&lt;")

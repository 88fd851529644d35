"""The stub's deployment forms and descriptors, made from its one source and served over HTTP."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from adapter.stub_files import STUB_SOURCE, StubFiles, StubSourceError, make_forms
from adapter.web_endpoints import WebPages

DOMAIN = "example.com"
# The fields dev-service-framework's CatalogueDataObjectFactory.createProtoStubDescriptorObject
# refuses a descriptor without.
CATALOGUE_FIELDS = {
    "cguid",
    "version",
    "objectName",
    "description",
    "language",
    "sourcePackageURL",
    "messageSchemas",
    "configuration",
    "constraints",
}

Client = TestClient[web.Request, web.Application]


async def test_the_forms_wrap_the_source_above_its_exports_block() -> None:
    forms = await StubFiles().forms()
    assert forms is not None
    source = STUB_SOURCE.read_text(encoding="utf-8")
    body = source.partition("\n// exports:")[0]
    assert forms.module == source
    assert body in forms.script and body in forms.system
    assert "export " not in forms.script.replace(body, "")
    assert forms.script.rstrip().endswith("globalThis.activate = activate;\n})();")
    assert "\nSystem.register([], function (_export) {" in forms.system
    assert "_export({ default: MatrixProtoStub, MatrixProtoStub, activate });" in forms.system
    assert forms.version == int(STUB_SOURCE.stat().st_mtime)


@pytest.mark.parametrize(
    "source",
    [
        "const a = 1;\nexport default a;\n",  # no exports block
        "export const a = 1;\n// exports: x\nexport default a;\n",  # an export above it
        "const a = 1;\n// exports: x\nexport default a;\nconsole.log(a);\n",  # code below it
    ],
)
def test_a_source_with_exports_elsewhere_is_refused(source: str) -> None:
    with pytest.raises(StubSourceError):
        make_forms(source, 1)


async def test_the_forms_follow_the_file_and_none_without_it(tmp_path: Path) -> None:
    path = tmp_path / "index.js"
    files = StubFiles(path)
    assert await files.forms() is None
    path.write_text("const a = 1;\n// exports:\nexport default a;\n", encoding="utf-8")
    os.utime(path, (1_000, 1_000))
    first = await files.forms()
    path.write_text("const a = 2;\n// exports:\nexport default a;\n", encoding="utf-8")
    os.utime(path, (2_000, 2_000))
    second = await files.forms()
    assert first is not None and second is not None
    assert "const a = 1;" in first.script and "const a = 2;" in second.script
    assert (first.version, second.version) == (1_000, 2_000)


@pytest.fixture
def stub_copy(tmp_path: Path) -> Path:
    path = tmp_path / "index.js"
    shutil.copyfile(STUB_SOURCE, path)
    return path


@pytest_asyncio.fixture
async def serve() -> AsyncIterator[Callable[..., Any]]:
    clients: list[Client] = []

    async def start(path: Path, public_url: str | None = None) -> Client:
        app = web.Application()
        WebPages(DOMAIN, StubFiles(path), public_url).add_routes(app)
        client: Client = TestClient(TestServer(app, host="127.0.0.1"))
        await client.start_server()
        clients.append(client)
        return client

    yield start
    for client in clients:
        await client.close()


async def test_runtime_core_finds_the_system_module_and_its_descriptor(
    serve: Callable[..., Any], stub_copy: Path
) -> None:
    client = await serve(stub_copy)
    forms = await StubFiles(stub_copy).forms()
    assert forms is not None
    async with client.get("/.well-known/protocolstub/default.ps.js") as response:
        assert response.status == 200
        assert response.content_type == "text/javascript"
        assert response.headers["Access-Control-Allow-Origin"] == "*"
        assert await response.text() == forms.system
    async with client.get("/.well-known/protocolstub/default.ps.json") as response:
        descriptor = await response.json()
        assert response.headers["Access-Control-Allow-Origin"] == "*"
        assert response.headers["Cache-Control"] == "no-store"
    port = client.server.port
    assert descriptor["configuration"] == {"messagingnode": f"ws://127.0.0.1:{port}/stub/connect"}
    assert descriptor["objectName"] == "default" and "sourcePackage" not in descriptor


async def test_the_catalogue_descriptor_carries_the_classic_script_by_get_or_post(
    serve: Callable[..., Any], stub_copy: Path
) -> None:
    client = await serve(stub_copy, "https://mn.example.com/rethink/")
    forms = await StubFiles(stub_copy).forms()
    assert forms is not None
    base = "/.well-known/protocolstub/default"
    # RuntimeCatalogue posts the runtime's constraints when it has them.
    constraints = json.dumps({"constraints": {"browser": True}})
    for method in ("GET", "POST"):
        async with client.request(method, base, data=constraints) as response:
            descriptor = await response.json(content_type=None)
        assert descriptor.keys() >= CATALOGUE_FIELDS
        assert descriptor["configuration"] == {
            "messagingnode": "wss://mn.example.com/rethink/stub/connect"
        }
        assert descriptor["sourcePackageURL"] == "/sourcePackage"
        package = descriptor["sourcePackage"]
        assert package["sourceCode"] == forms.script
        assert package["sourceCodeClassname"] == "MatrixProtoStub"
        async with client.request(method, f"{base}/version", data=constraints) as response:
            assert await response.text() == str(forms.version) == str(descriptor["version"])
        async with client.request(method, f"{base}/cguid", data=constraints) as response:
            cguid = await response.text()
        assert cguid == descriptor["cguid"] == "rethink-mn-protostub-example.com"
        async with client.request(method, f"{base}/sourcePackage") as response:
            assert await response.json(content_type=None) == package


async def test_the_es_modules_and_the_classic_script(
    serve: Callable[..., Any], stub_copy: Path
) -> None:
    client = await serve(stub_copy)
    forms = await StubFiles(stub_copy).forms()
    assert forms is not None
    expected = {
        "/stub/protostub.js": forms.module,
        "/stub/protostub.script.js": forms.script,
        "/stub/protostub.component.js": (
            "export { MatrixProtoStub as default, MatrixProtoStub, activate }"
            " from './protostub.js';\n"
        ),
    }
    for path, text in expected.items():
        async with client.get(path) as response:
            assert response.content_type == "text/javascript", path
            assert await response.text() == text, path


async def test_without_the_source_every_form_is_not_found(
    serve: Callable[..., Any], tmp_path: Path
) -> None:
    client = await serve(tmp_path / "absent.js")
    for path in (
        "/stub/protostub.js",
        "/stub/protostub.script.js",
        "/stub/protostub.component.js",
        "/.well-known/protocolstub/default.ps.js",
        "/.well-known/protocolstub/default.ps.json",
        "/.well-known/protocolstub/default",
        "/.well-known/protocolstub/default/version",
    ):
        async with client.get(path) as response:
            assert response.status == 404, path
            assert "not installed" in await response.text()

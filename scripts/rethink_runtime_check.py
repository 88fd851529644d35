#!/usr/bin/env python3
"""reTHINK's own browser runtimes, unmodified, deploy this node's stub and their hyperties talk.

Outside CI, like reTHINK's message-node suite: it needs snapshots of reTHINK's repositories, which
are never copied into this project. Against a running node (``rethink-mn up``), in headless
Chromium, for each of the two ways reTHINK runtimes deploy a stub:

- ``browser``: dev-runtime-browser's ``bin/`` (rethink.js in the app page, index.html and core.js
  in its iframe, context-service.js in Web Workers) running runtime-core's ``dist/Runtime.js`` of
  the commit that ``bin/`` was built with (2018). The runtime asks the domain's catalogue for the
  stub (``https://catalogue.<domain>/.well-known/protocolstub/default``) and evaluates its source
  package in a Worker sandbox;
- ``core``: runtime-core's own browser runtime of 2019 (``dist/rethink.js``, on SystemJS 3.1.6),
  which imports ``https://<domain>/.well-known/protocolstub/default.ps.js``, makes
  ``new result.default()``, reads ``default.ps.json`` and calls ``_start`` in an in-page sandbox.

Both URLs are passed on to the node, as a domain's web server would. Two runtimes (Alice, Bob),
in browser contexts of their own, log in and load a hyperty each; Alice's sends Bob's numbered
messages; Bob reloads (his page, and with it his sandboxes, is closed while Alice goes on sending;
a new page of the same browser context is the same runtime, its runtimeURL kept in IndexedDB),
loads his hyperty again (same address), and the script counts what his stub handed to his
runtime and what reached his hyperty.

What the runtimes fetch from elsewhere is served by this script: reTHINK's files from the
snapshots, from npm what the runtimes' pages load from CDNs (jQuery, material-components-web,
SystemJS), and the objects in ``scripts/rethink_runtime_check/``: a stand-in identity provider
(the runtimes register no hyperty without an identity) and a ``Pinger`` hyperty.

    .venv/bin/rethink-mn -c /tmp/check-var/config.yaml up --state-dir /tmp/check-var &
    .venv/bin/python scripts/rethink_runtime_check.py \\
        --runtime-browser <dev-runtime-browser snapshot> --runtime-core <dev-runtime-core snapshot>

Exit status 0 when, in every runtime, Bob's stub handed his runtime every message (a second time
only when the runtime had handed it back for want of a listener: the stub's ``returned``) and
every message reached his hyperty exactly once; 1 otherwise (the report says at which level).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from playwright.async_api import BrowserContext, Page, Route, Worker, async_playwright

# dev-runtime-browser's last release ("new dist with runtime master branch", 2018-10-24), and the
# runtime-core master merge it was built from, the same hour.
BROWSER_COMMIT = "f10763358b8ffd76ac8399341ef691cf97d49843"
CORE_COMMIT = "760248608101b831607a70080a92f2581d8935ba"
# runtime-core after its SystemJS change: the last commit (develop, 2019-06-27).
CORE_2019_COMMIT = "4a7264e6e06812bf43aa8166fa10e2d040ff28bc"
# What the runtimes' pages load from CDNs, as npm has it.
NPM_DEPS = ["jquery@2.1.4", "material-components-web@0.27.0", "systemjs@3.1.6"]
IDP = "check.localhost"
HERE = Path(__file__).with_suffix("")


def git_show(repo: Path, commit: str, path: str) -> bytes:
    git_dir = repo / ".git" if (repo / ".git").is_dir() else repo
    done = subprocess.run(
        ["git", "--git-dir", str(git_dir), "show", f"{commit}:{path}"],
        capture_output=True,
        check=False,
    )
    if done.returncode != 0:
        raise FileNotFoundError(f"{repo} has no {commit}:{path}")
    return done.stdout


def catalogue_object(name: str, source: str, **fields: Any) -> dict[str, Any]:
    """A descriptor in dev-service-framework's RuntimeCatalogue format, its source inside."""
    return {
        "cguid": f"rethink-mn-check-{name}",
        "version": 1,
        "objectName": name,
        "description": f"{name}, served by scripts/rethink_runtime_check.py",
        "language": "javascript",
        "signature": "",
        "sourcePackageURL": "/sourcePackage",
        "messageSchemas": [],
        "dataObjects": [],
        "configuration": {},
        "constraints": {},
        "sourcePackage": {"sourceCodeClassname": name, "encoding": "utf-8", "sourceCode": source},
        **fields,
    }


class Site:
    """Everything the runtimes fetch over https, answered through Playwright's routing."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.domain: str = args.domain
        self.node: str = args.node.rstrip("/")
        self.deps = Path(args.deps)
        self.browser_repo = Path(args.runtime_browser)
        self.browser_commit: str = args.browser_commit
        core = Path(args.runtime_core)
        runtime = git_show(core, args.core_commit, "dist/Runtime.js").decode()
        self.rethink_2019 = git_show(core, args.core_2019_commit, "dist/rethink.js")
        idp_proxy = (HERE / "idp_proxy.js").read_text() % {"idp": IDP}
        pinger = (HERE / "pinger.js").read_text()
        names = {"domain": self.domain, "idp": IDP}
        self.apps = {flavor: (HERE / f"{flavor}.html").read_text() % names for flavor in FLAVORS}
        # runtime-core 2019 loads System.register modules with a descriptor beside each.
        self.modules = {
            "hyperty/Pinger.hy.js": system_module("pinger", pinger),
            "idp-proxy/default.idp.js": system_module("idp_proxy", idp_proxy),
        }
        self.descriptors = {
            "hyperty/Pinger.hy.json": {
                "name": "Pinger",
                "language": "javascript",
                "signature": "",
                "configuration": {},
                "constraints": {"browser": True},
                "hypertyType": ["ping"],
                # runtime-core 2019 needs one (it fills in %domain%); the scheme is not used.
                "dataObjects": ["https://%domain%/.well-known/dataschema/Ping"],
            },
            "idp-proxy/default.idp.json": {
                "name": "StandInIdp",
                "language": "javascript",
                "description": "stand-in",
                "signature": "",
                "configuration": {},
                "constraints": {"browser": True},
                "interworking": True,
                "objectName": IDP,
            },
            "idp-proxy/all.json": {"idps": [IDP]},
        }
        # The catalogue of runtime-core 2018, in dev-service-framework's RuntimeCatalogue format.
        self.catalogue = {
            "runtime/Runtime": catalogue_object(
                "Runtime",
                runtime,
                type="runtime",
                runtimeType="browser",
                hypertyCapabilities={},
                protocolCapabilities={},
                p2pHandlerStub="",
                p2pRequesterStub="",
            ),
            "hyperty/Pinger": catalogue_object(
                "Pinger",
                pinger,
                type="hyperty",
                hypertyType=["ping"],
                constraints={"browser": True},
            ),
            # The runtime asks catalogue.<idp> for …/idp-proxy/default first.
            "idp-proxy/default": catalogue_object(IDP, idp_proxy, interworking=False),
        }
        self.passed_to_node: set[str] = set()

    async def handle(self, route: Route) -> None:
        url = route.request.url.split("?", 1)[0].split("#", 1)[0]
        host, _, path = url.removeprefix("https://").partition("/")
        cors = {"Access-Control-Allow-Origin": "*"}
        well_known = path.removeprefix(".well-known/")
        if path.startswith(".well-known/protocolstub/"):
            # The domain's stub is the node's: passed on, as a domain's web server would.
            self.passed_to_node.add(f"{route.request.method} {url}")
            response = await route.fetch(url=f"{self.node}/{path}")
            await route.fulfill(response=response)
        elif host == self.domain and path.startswith("rethink-mn-check/"):
            await self._own_file(route, path.removeprefix("rethink-mn-check/"))
        elif host == self.domain and path.startswith(".well-known/runtime/"):
            await self._runtime_file(route, path.removeprefix(".well-known/runtime/"))
        elif host.startswith("catalogue.") and path.startswith(".well-known/"):
            await self._catalogue(route, well_known)
        elif well_known in self.modules:
            await route.fulfill(
                body=self.modules[well_known], content_type="text/javascript", headers=cors
            )
        elif well_known in self.descriptors:
            await route.fulfill(json=self.descriptors[well_known], headers=cors)
        elif "jquery" in url:
            await route.fulfill(path=self.deps / "node_modules/jquery/dist/jquery.js")
        elif "material-components-web" in url:
            kind = "css" if url.endswith(".css") else "js"
            dist = self.deps / "node_modules/material-components-web/dist"
            await route.fulfill(path=dist / f"material-components-web.{kind}")
        else:
            await route.abort()  # web fonts and the like: nothing the runtimes need

    async def _own_file(self, route: Route, name: str) -> None:
        if name.endswith(".html"):
            app = self.apps[name.removesuffix(".html")]
            await route.fulfill(body=app, content_type="text/html")
        elif name == "system.js":
            dist = self.deps / "node_modules/systemjs/dist/system.js"
            await route.fulfill(path=dist, content_type="text/javascript")
        elif name == "rethink.js":
            await route.fulfill(body=self.rethink_2019, content_type="text/javascript")
        else:
            await route.fulfill(status=404)

    async def _runtime_file(self, route: Route, name: str) -> None:
        try:
            body = git_show(self.browser_repo, self.browser_commit, f"bin/{name}")
        except FileNotFoundError:
            await route.fulfill(status=404)
            return
        types = {".html": "text/html", ".svg": "image/svg+xml", ".js": "text/javascript"}
        kind = next((t for ext, t in types.items() if name.endswith(ext)), "text/plain")
        await route.fulfill(body=body, content_type=kind)

    async def _catalogue(self, route: Route, path: str) -> None:
        cors = {"Access-Control-Allow-Origin": "*"}
        if path.rstrip("/") == "idp-proxy":  # the IdPs the runtime offers to log in with
            await route.fulfill(json=[IDP], headers=cors)
            return
        for key, descriptor in self.catalogue.items():
            if path == key or path.startswith(key + "/"):
                field = path.removeprefix(key).strip("/")
                value = descriptor[field] if field else descriptor
                text = json.dumps(value) if isinstance(value, dict) else str(value)
                await route.fulfill(body=text, content_type="application/json", headers=cors)
                return
        await route.fulfill(status=404, headers=cors)


def system_module(name: str, activate: str) -> str:
    """``<name>.system.js``: the classic script's ``activate`` as a System.register class."""
    return (HERE / f"{name}.system.js").read_text().replace("%(activate)s", activate)


class Runtime:
    """One reTHINK browser runtime: a browser context of its own, one page at a time."""

    def __init__(self, name: str, flavor: str, context: BrowserContext, site: Site) -> None:
        self.name = name
        self._flavor = flavor
        self._context = context
        self._domain = site.domain
        self._timeout = 60.0
        self._page: Page | None = None
        self.errors: set[str] = set()

    @property
    def page(self) -> Page:
        assert self._page is not None, f"{self.name}'s runtime is not running"
        return self._page

    async def start(self, timeout: float) -> str:
        """Opens the app, which installs the runtime and loads the hyperty; its address."""
        self._timeout = timeout
        page = await self._context.new_page()
        page.on("pageerror", lambda error: self.errors.add(str(error)))
        if self._flavor == "browser":
            page.on("worker", lambda worker: asyncio.ensure_future(self._watch(worker)))
        self._page = page
        await page.goto(f"https://{self._domain}/rethink-mn-check/{self._flavor}.html")
        done = "steps.some((s) => s.startsWith('hyperty') || s.startsWith('failed'))"
        await self.until(done, "the hyperty")
        steps = await page.evaluate("steps")
        if not steps[-1].startswith("hyperty "):
            raise RuntimeError(f"{self.name}'s runtime did not load its hyperty: {steps}")
        return str(steps[-1].removeprefix("hyperty "))

    async def until(self, expression: str, what: str) -> Any:
        """Polls a page expression until it is truthy."""
        deadline = time.monotonic() + self._timeout
        guarded = f"() => {{ try {{ return {expression}; }} catch (e) {{ return false; }} }}"
        while not (value := await self.page.evaluate(guarded)):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name}: timed out waiting for {what}")
            await asyncio.sleep(0.1)
        return value

    async def stub_until(self, key: str, value: int, what: str) -> dict[str, Any]:
        """Polls the stub's stats until `key` has `value`."""
        deadline = time.monotonic() + self._timeout
        while (stats := await self.stub_stats()).get(key) != value:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name}: timed out waiting for {what}: {stats}")
            await asyncio.sleep(0.1)
        return stats

    async def stub_stats(self) -> dict[str, Any]:
        """The counters of the stub the runtime deployed (read only)."""
        if self._flavor == "core":
            stats = await self.page.evaluate("() => stubs.length ? stubs.at(-1).stats : null")
            return dict(stats or {})
        for worker in self.page.workers:
            stats = await worker.evaluate(
                """() => {
                  const components = self._registry ? Object.values(self._registry.components) : [];
                  const stub = components.find((c) => c && c.name === 'MatrixProtoStub');
                  return stub ? stub.instance.stats : null;
                }"""
            )
            if stats:
                return dict(stats)
        return {}

    async def handed_on(self) -> list[int]:
        """The numbers of the pings the stub handed to the runtime in this page."""
        if self._flavor == "core":
            return list(await self.page.evaluate("pingsHandedOn"))
        numbers: list[int] = []
        for worker in self.page.workers:
            numbers += await worker.evaluate("() => self.__pingsHandedOn || []")
        return numbers

    async def _watch(self, worker: Worker) -> None:
        watch = (HERE / "watch_sandbox.js").read_text()
        for _ in range(500):  # until the sandbox's bus exists, before any stub is deployed
            try:
                if await worker.evaluate(watch):
                    return
            except Exception as err:  # noqa: BLE001 - the Worker went away with its page
                self.errors.add(f"watching a Worker: {err}")
                return
            await asyncio.sleep(0.01)

    async def close(self) -> None:
        for page in self._context.pages:  # the app, and the IdP login window the runtime opened
            await page.close()
        self._page = None


async def check(args: argparse.Namespace, site: Site) -> int:
    ok = True
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(
            executable_path=args.chromium,
            args=[
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                # The runtimes' pages come from https://<domain> through Playwright, which
                # Chromium counts as a public address; the node here listens on loopback.
                "--disable-features=LocalNetworkAccessChecks",
            ],
        )
        for flavor in ("browser", "core") if args.flavor == "both" else (args.flavor,):
            print(f"== {flavor}: {FLAVORS[flavor]}")
            runtimes = []
            for name in ("Alice", "Bob"):
                context = await browser.new_context(ignore_https_errors=True)
                await context.route("https://**/*", site.handle)
                runtimes.append(Runtime(name, flavor, context, site))
            site.passed_to_node.clear()
            alice, bob = runtimes
            try:
                ok = await exchange(alice, bob, site, args) and ok
            finally:
                for runtime in runtimes:
                    if runtime.errors:
                        print(f"{runtime.name}'s page errors: {sorted(runtime.errors)}")
                    await runtime.close()
        await browser.close()
    return 0 if ok else 1


FLAVORS = {
    "browser": "dev-runtime-browser (2018): the catalogue's source package in a Worker sandbox",
    "core": "runtime-core (2019): default.ps.js through SystemJS, `new`, `_start`, in the page",
}


async def exchange(alice: Runtime, bob: Runtime, site: Site, args: argparse.Namespace) -> bool:
    before, away = args.before, args.while_away
    started = time.monotonic()
    alice_hyperty = await alice.start(args.timeout)
    bob_hyperty = await bob.start(args.timeout)
    print(f"runtimes up in {time.monotonic() - started:.1f} s")
    print(f"  Alice's hyperty {alice_hyperty}, Bob's {bob_hyperty}")
    print("requests for the stub, passed on to the node:")
    for line in sorted(site.passed_to_node):
        print(f"  {line}")

    await alice.page.evaluate("([to, n]) => pinger.ping(to, 1, n)", [bob_hyperty, before])
    await bob.until(f"pinger.received.length >= {before}", "Alice's first messages")
    # A reload that loses nothing needs what Bob got acknowledged and recorded first.
    stats = await bob.stub_until("unrecorded", 0, "Bob's session recorded")
    first_life = await bob.page.evaluate("pinger.received")
    first_handed = await bob.handed_on()
    print(f"Bob's stub before the reload: {stats}")
    await bob.close()

    await alice.page.evaluate(
        "([to, first, n]) => pinger.ping(to, first, n)", [bob_hyperty, before + 1, away]
    )
    stats = await alice.stub_until("unacknowledged", 0, "the node to have them")
    print(f"Alice sent {away} more while Bob was away; her stub: {stats}")

    bob_again = await bob.start(args.timeout)
    print(f"Bob reloaded, his hyperty {bob_again}")
    last = before + away + 1
    await alice.page.evaluate("([to, n]) => pinger.ping(to, n, 1)", [bob_again, last])
    try:
        await bob.until(f"pinger.received.includes({last})", "Alice's last message")
    except TimeoutError as err:
        print(err)
    second_life = await bob.page.evaluate("pinger.received")
    second_handed = await bob.handed_on()
    after = await bob.stub_stats()
    print(f"Bob's stub after the reload: {after}")

    sent = set(range(1, last + 1))
    ok = True
    for level, got_before, got_after in (
        ("handed to Bob's runtime by his stub", first_handed, second_handed),
        ("reached Bob's hyperty", first_life, second_life),
    ):
        got = got_before + got_after
        lost = sorted(sent - set(got))
        duplicated = len(got) - len(set(got))
        print(f"{level}: before the reload {got_before}, after it {got_after}")
        if level.startswith("handed"):
            # The stub hands a message again when the runtime handed it back (no listener for
            # its hyperty yet): counted by the stub as `returned`; only more would be duplicates.
            again = min(duplicated, int(after.get("returned", 0)))
            duplicated -= again
            print(
                f"  sent {last}, lost {len(lost)} {lost}, duplicated {duplicated}, "
                f"handed again after the runtime handed them back {again}"
            )
        else:
            print(f"  sent {last}, lost {len(lost)} {lost}, duplicated {duplicated}")
        ok = ok and not lost and duplicated == 0
    return ok


def ensure_deps(deps: Path) -> None:
    if all((deps / "node_modules" / name.split("@")[0]).exists() for name in NPM_DEPS):
        return
    deps.mkdir(parents=True, exist_ok=True)
    npm = ["npm", "install", "--no-audit", "--no-fund", "--prefix", str(deps), *NPM_DEPS]
    subprocess.run(npm, check=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--runtime-browser", required=True, help="dev-runtime-browser snapshot")
    parser.add_argument("--runtime-core", required=True, help="dev-runtime-core snapshot")
    parser.add_argument("--browser-commit", default=BROWSER_COMMIT)
    parser.add_argument("--core-commit", default=CORE_COMMIT)
    parser.add_argument("--core-2019-commit", default=CORE_2019_COMMIT)
    parser.add_argument("--flavor", choices=["browser", "core", "both"], default="both")
    parser.add_argument("--node", default="http://127.0.0.1:9090", help="the stub listener")
    parser.add_argument("--domain", default="localhost", help="the node's reTHINK domain")
    cache = Path.home() / ".cache/rethink-mn/rethink-runtime-deps"
    parser.add_argument("--deps", default=str(cache), help="where npm puts jQuery and MDC")
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    parser.add_argument("--before", type=int, default=20, help="messages before Bob's reload")
    parser.add_argument("--while-away", type=int, default=20, help="messages while he is away")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per step")
    args = parser.parse_args()
    descriptor = f"{args.node.rstrip('/')}/.well-known/protocolstub/default"
    try:
        with urllib.request.urlopen(descriptor, timeout=10):
            pass
    except OSError as err:
        print(f"no protocol-stub descriptor at {descriptor}: {err}", file=sys.stderr)
        return 2
    ensure_deps(Path(args.deps))
    return asyncio.run(check(args, Site(args)))


if __name__ == "__main__":
    sys.exit(main())

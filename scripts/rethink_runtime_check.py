#!/usr/bin/env python3
"""reTHINK's own browser runtime, unmodified, deploys this node's stub and its hyperties talk.

Outside CI, like reTHINK's message-node suite: it needs snapshots of reTHINK's repositories, which
are never copied into this project. Against a running node (``rethink-mn up``), in headless
Chromium:

- two runtimes (Alice, Bob), each dev-runtime-browser's ``bin/`` (rethink.js in the app page,
  index.html and core.js in its iframe, context-service.js in Web Workers) running runtime-core's
  ``dist/Runtime.js`` of the commit that ``bin/`` was built with, in browser contexts of their own;
- each installs from ``https://<domain>/.well-known/runtime/``, gets its runtime from the domain's
  catalogue, logs in and loads a hyperty; the runtime then fetches the domain's protocol stub from
  the catalogue (``https://catalogue.<domain>/.well-known/protocolstub/default``, which this script
  passes on to the node, as a domain's web server would) and evaluates it in a Worker sandbox;
- Alice's hyperty sends Bob's numbered messages; Bob reloads (his page, and with it his Worker, is
  closed while Alice goes on sending; a new page of the same browser context is the same runtime,
  its runtimeURL kept in IndexedDB), loads his hyperty again (same address), and the script counts
  what his stub handed to his runtime and what reached his hyperty.

What the runtime fetches from elsewhere is served by this script: dev-runtime-browser's files and
runtime-core's Runtime.js from the snapshots, jQuery and material-components-web (which the
runtime's index.html loads from CDNs) from npm, and the catalogue objects in
``scripts/rethink_runtime_check/``: a stand-in identity provider (the runtime registers no hyperty
without an identity) and a ``Pinger`` hyperty.

    .venv/bin/rethink-mn up --state-dir /tmp/check-var &
    .venv/bin/python scripts/rethink_runtime_check.py \\
        --runtime-browser <dev-runtime-browser snapshot> --runtime-core <dev-runtime-core snapshot>

Exit status 0 when Bob's stub handed his runtime every message exactly once and every message
reached his hyperty; 1 otherwise (the report says at which level they were lost).
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
# What the runtime's index.html loads from CDNs, as npm has it.
NPM_DEPS = ["jquery@2.1.4", "material-components-web@0.27.0"]
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
        runtime = git_show(Path(args.runtime_core), args.core_commit, "dist/Runtime.js").decode()
        idp_proxy = (HERE / "idp_proxy.js").read_text() % {"idp": IDP}
        self.app = (HERE / "app.html").read_text() % {"domain": self.domain, "idp": IDP}
        self.objects = {
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
                (HERE / "pinger.js").read_text(),
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
        if path.startswith(".well-known/protocolstub/"):
            # The domain's stub is the node's: passed on, as a domain's web server would.
            self.passed_to_node.add(f"{route.request.method} {url}")
            response = await route.fetch(url=f"{self.node}/{path}")
            await route.fulfill(response=response)
        elif host == self.domain and path == "rethink-mn-check.html":
            await route.fulfill(body=self.app, content_type="text/html")
        elif host == self.domain and path.startswith(".well-known/runtime/"):
            await self._runtime_file(route, path.removeprefix(".well-known/runtime/"))
        elif host.startswith("catalogue.") and path.startswith(".well-known/"):
            await self._catalogue(route, path.removeprefix(".well-known/"))
        elif "jquery" in url:
            await route.fulfill(path=self.deps / "node_modules/jquery/dist/jquery.js")
        elif "material-components-web" in url:
            kind = "css" if url.endswith(".css") else "js"
            dist = self.deps / "node_modules/material-components-web/dist"
            await route.fulfill(path=dist / f"material-components-web.{kind}")
        else:
            await route.abort()  # web fonts and the like: nothing the runtime needs

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
        for key, descriptor in self.objects.items():
            if path == key or path.startswith(key + "/"):
                field = path.removeprefix(key).strip("/")
                value = descriptor[field] if field else descriptor
                text = json.dumps(value) if isinstance(value, dict) else str(value)
                await route.fulfill(body=text, content_type="application/json", headers=cors)
                return
        await route.fulfill(status=404, headers=cors)


class Runtime:
    """One reTHINK browser runtime: a browser context of its own, one page at a time."""

    def __init__(self, name: str, context: BrowserContext, domain: str, timeout: float) -> None:
        self.name = name
        self._context = context
        self._domain = domain
        self._timeout = timeout
        self._page: Page | None = None
        self.errors: set[str] = set()

    @property
    def page(self) -> Page:
        assert self._page is not None, f"{self.name}'s runtime is not running"
        return self._page

    async def start(self) -> str:
        """Opens the app, which installs the runtime and loads the hyperty; its address."""
        page = await self._context.new_page()
        page.on("pageerror", lambda error: self.errors.add(str(error)))
        page.on("worker", lambda worker: asyncio.ensure_future(self._watch(worker)))
        self._page = page
        await page.goto(f"https://{self._domain}/rethink-mn-check.html")
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
        """Polls the stats of the stub in the runtime's Worker until `key` has `value`."""
        deadline = time.monotonic() + self._timeout
        while (stats := await self.stub_stats()).get(key) != value:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name}: timed out waiting for {what}: {stats}")
            await asyncio.sleep(0.1)
        return stats

    async def stub_stats(self) -> dict[str, Any]:
        """The counters of the stub the runtime deployed in a Worker sandbox (read only)."""
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
        """The numbers of the pings the Worker sandboxes of this page handed to the runtime."""
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
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(
            executable_path=args.chromium,
            args=[
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                # The runtime's pages come from https://<domain> through Playwright, which
                # Chromium counts as a public address; the node here listens on loopback.
                "--disable-features=LocalNetworkAccessChecks",
            ],
        )
        runtimes = []
        for name in ("Alice", "Bob"):
            context = await browser.new_context(ignore_https_errors=True)
            await context.route("https://**/*", site.handle)
            runtimes.append(Runtime(name, context, site.domain, args.timeout))
        alice, bob = runtimes
        try:
            ok = await exchange(alice, bob, site, args.before, args.while_away)
        finally:
            for runtime in runtimes:
                if runtime.errors:
                    print(f"{runtime.name}'s page errors: {sorted(runtime.errors)}")
            await browser.close()
    return 0 if ok else 1


async def exchange(alice: Runtime, bob: Runtime, site: Site, before: int, away: int) -> bool:
    started = time.monotonic()
    alice_hyperty = await alice.start()
    bob_hyperty = await bob.start()
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

    bob_again = await bob.start()
    print(f"Bob reloaded, his hyperty {bob_again}")
    last = before + away + 1
    await alice.page.evaluate("([to, n]) => pinger.ping(to, n, 1)", [bob_again, last])
    try:
        await bob.until(f"pinger.received.includes({last})", "Alice's last message")
    except TimeoutError as err:
        print(err)
    second_life = await bob.page.evaluate("pinger.received")
    second_handed = await bob.handed_on()
    print(f"Bob's stub after the reload: {await bob.stub_stats()}")

    sent = set(range(1, last + 1))
    ok = True
    for level, got_before, got_after in (
        ("handed to Bob's runtime by his stub", first_handed, second_handed),
        ("reached Bob's hyperty", first_life, second_life),
    ):
        got = got_before + got_after
        lost = sorted(sent - set(got))
        duplicated = len(got) - len(set(got))
        ok = ok and not lost and duplicated == 0
        print(f"{level}: before the reload {got_before}, after it {got_after}")
        print(f"  sent {last}, lost {len(lost)} {lost}, duplicated {duplicated}")
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

"""The reverse proxies of contrib/, run as shipped: the template rendered with this test's ports
and certificate, started in the foreground in a directory of its own, stopped on the way out."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import re
import shutil
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from adapter.localstack.synapse import free_port
from adapter.localstack.tls import KeyPair, ensure_ca, ensure_server_certificate

ROOT = Path(__file__).resolve().parents[2]
NGINX_TEMPLATE = ROOT / "contrib" / "nginx" / "rethink-mn.conf"
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
CADDY_TEMPLATE = ROOT / "contrib" / "caddy" / "rethink-mn.Caddyfile"
CADDY = shutil.which("caddy") or "/usr/bin/caddy"
PROXIES = ("nginx", "caddy")


@dataclass(frozen=True)
class ProxyCertificate:
    """A server certificate for ``name`` from a CA made for the test."""

    ca: KeyPair
    server: KeyPair

    def client_context(self) -> ssl.SSLContext:
        """A client that trusts the test CA only."""
        return ssl.create_default_context(cafile=str(self.ca.certificate))

    def spki_sha256(self) -> str:
        """The server key's SPKI fingerprint, as Chromium's --ignore-certificate-errors-spki-list
        takes it: the one key a browser is told to accept besides its own roots."""
        cert = x509.load_pem_x509_certificate(self.server.certificate.read_bytes())
        spki = cert.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        return base64.b64encode(hashlib.sha256(spki).digest()).decode()


def make_certificate(directory: Path, name: str) -> ProxyCertificate:
    ca = ensure_ca(directory)
    server = ensure_server_certificate(
        ca, directory, name, dns_names=[name], ip_addresses=["127.0.0.1"]
    )
    return ProxyCertificate(ca, server)


def _fill(template: Path, values: dict[str, str]) -> str:
    text = template.read_text(encoding="utf-8")
    for key, value in values.items():
        text = text.replace(f"@{key}@", value)
    left = re.findall(r"@[A-Z_]+@", text)
    assert not left, f"placeholders the test does not fill: {left}"
    return text


def render_nginx_site(
    *, server_name: str, port: int, cert: KeyPair, stub: str, appservice: str, web_root: Path
) -> str:
    """contrib/nginx/rethink-mn.conf with its placeholders filled, as an operator fills them."""
    return _fill(
        NGINX_TEMPLATE,
        {
            "SERVER_NAME": server_name,
            "LISTEN": f"127.0.0.1:{port}",
            "CERTIFICATE": str(cert.certificate),
            "PRIVATE_KEY": str(cert.private_key),
            "STUB": stub,
            "APPSERVICE": appservice,
            "WEB_ROOT": str(web_root),
        },
    )


def _nginx_main(prefix: Path, site: Path) -> str:
    """The main configuration Debian's /etc/nginx/nginx.conf would be, with every file nginx
    writes kept under ``prefix`` (the test does not touch the machine's nginx)."""
    user = "user root;\n" if os.geteuid() == 0 else ""  # workers must read the test's files
    temp = "\n".join(
        f"    {kind}_temp_path {prefix / kind};" for kind in ("client_body", "proxy", "fastcgi")
    )
    return (
        f"{user}daemon off;\n"
        "worker_processes 1;\n"
        f"pid {prefix / 'nginx.pid'};\n"
        f"error_log {prefix / 'error.log'} info;\n"
        "events { worker_connections 512; }\n"
        "http {\n"
        "    include /etc/nginx/mime.types;\n"
        f"    access_log {prefix / 'access.log'};\n"
        f"{temp}\n"
        f"    uwsgi_temp_path {prefix / 'uwsgi'};\n"
        f"    scgi_temp_path {prefix / 'scgi'};\n"
        f"    include {site};\n"
        "}\n"
    )


def _write_nginx_files(prefix: Path, site_text: str) -> Path:
    """The site and the main configuration under ``prefix``; the main one's path."""
    prefix.mkdir(parents=True, exist_ok=True)
    site = prefix / "rethink-mn.conf"
    site.write_text(site_text, encoding="utf-8")
    main = prefix / "nginx.conf"
    main.write_text(_nginx_main(prefix, site), encoding="utf-8")
    return main


@dataclass
class RunningProxy:
    kind: str
    port: int
    prefix: Path

    def log(self) -> str:
        parts = []
        for name in ("stderr.log", "error.log", "access.log"):
            path = self.prefix / name
            if path.exists():
                parts.append(f"--- {name}\n{path.read_text(errors='replace')[-4000:]}")
        return "\n".join(parts)


async def _until_listening(proc: asyncio.subprocess.Process, running: RunningProxy) -> None:
    async with asyncio.timeout(30):
        while True:
            assert proc.returncode is None, f"{running.kind} exited:\n{running.log()}"
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", running.port)
            except OSError:
                await asyncio.sleep(0.05)
                continue
            writer.close()
            await writer.wait_closed()
            return


@asynccontextmanager
async def nginx(
    prefix: Path, *, server_name: str, cert: KeyPair, stub: str, appservice: str, web_root: Path
) -> AsyncIterator[RunningProxy]:
    """nginx serving contrib/nginx/rethink-mn.conf on a free loopback port."""
    port = free_port()
    site = render_nginx_site(
        server_name=server_name,
        port=port,
        cert=cert,
        stub=stub,
        appservice=appservice,
        web_root=web_root,
    )
    main = await asyncio.to_thread(_write_nginx_files, prefix, site)
    command = [NGINX, "-p", str(prefix), "-e", str(prefix / "error.log"), "-c", str(main)]
    async with _running([*command, "-t"], command, RunningProxy("nginx", port, prefix)) as running:
        yield running


@asynccontextmanager
async def caddy(
    prefix: Path, *, server_name: str, cert: KeyPair, stub: str, appservice: str, web_root: Path
) -> AsyncIterator[RunningProxy]:
    """caddy serving contrib/caddy/rethink-mn.Caddyfile on a free loopback port."""
    port = free_port()
    site = _fill(
        CADDY_TEMPLATE,
        {
            "SITE": f"{server_name}:{port}",
            "CERTIFICATE": str(cert.certificate),
            "PRIVATE_KEY": str(cert.private_key),
            "STUB": stub,
            "APPSERVICE": appservice,
            "WEB_ROOT": str(web_root),
        },
    )
    # Debian's /etc/caddy/Caddyfile would hold the site; the test's global options keep Caddy
    # to loopback, off port 80 and the admin port, and its files under ``prefix``.
    options = (
        "{\n"
        "\tadmin off\n"
        "\tauto_https disable_redirects\n"
        "\tskip_install_trust\n"
        "\tdefault_bind 127.0.0.1\n"
        f"\thttp_port {free_port()}\n"
        f"\thttps_port {port}\n"
        f"\tstorage file_system {prefix / 'data'}\n"
        f"\tlog {{\n\t\toutput file {prefix / 'error.log'}\n\t}}\n"
        "}\n\n"
    )
    config = await asyncio.to_thread(_write_caddy_file, prefix, options + site)
    command = [CADDY, "run", "--adapter", "caddyfile", "--config", str(config)]
    check = [CADDY, "validate", "--adapter", "caddyfile", "--config", str(config)]
    async with _running(check, command, RunningProxy("caddy", port, prefix)) as running:
        yield running


def _write_caddy_file(prefix: Path, text: str) -> Path:
    prefix.mkdir(parents=True, exist_ok=True)
    config = prefix / "Caddyfile"
    config.write_text(text, encoding="utf-8")
    return config


def proxy(kind: str) -> Any:
    """The runner of the proxy named ``kind`` (one of PROXIES)."""
    return {"nginx": nginx, "caddy": caddy}[kind]


@asynccontextmanager
async def _running(
    check: list[str], command: list[str], running: RunningProxy
) -> AsyncIterator[RunningProxy]:
    environment = {
        **os.environ,
        "HOME": str(running.prefix),
        "XDG_DATA_HOME": str(running.prefix / "data"),
        "XDG_CONFIG_HOME": str(running.prefix / "config"),
    }
    checked = await asyncio.create_subprocess_exec(
        *check, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=environment
    )
    out, _ = await checked.communicate()
    assert checked.returncode == 0, f"{running.kind} refused the configuration:\n{out.decode()}"
    log = os.open(running.prefix / "stderr.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        proc = await asyncio.create_subprocess_exec(
            *command, stdout=log, stderr=log, env=environment
        )
    finally:
        os.close(log)
    try:
        await _until_listening(proc, running)
        yield running
    finally:
        if proc.returncode is None:
            proc.terminate()  # a fast shutdown, for both
        await asyncio.wait_for(proc.wait(), timeout=30)

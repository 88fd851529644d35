"""The local federation CA and certificates: made once, reused while they fit, replaced when not."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

import pytest
from cryptography import x509

from adapter.localstack import tls
from adapter.localstack.ip_blocklist import SYNAPSE_DEFAULT_BLOCKLIST, blocklist_except


def _cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_a_leaf_is_signed_by_the_ca_for_its_ip_address(tmp_path: Path) -> None:
    ca = tls.ensure_ca(tmp_path / "ca")
    leaf = tls.ensure_server_certificate(ca, tmp_path, "hs", ip_addresses=["127.0.0.1"])
    cert = _cert(leaf.certificate)
    cert.verify_directly_issued_by(_cert(ca.certificate))
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert leaf.private_key.stat().st_mode & 0o077 == 0


def test_valid_files_are_reused(tmp_path: Path) -> None:
    ca = tls.ensure_ca(tmp_path)
    leaf = tls.ensure_server_certificate(ca, tmp_path, "hs", ip_addresses=["127.0.0.1"])
    before = (ca.certificate.read_bytes(), leaf.certificate.read_bytes())
    ca = tls.ensure_ca(tmp_path)
    leaf = tls.ensure_server_certificate(ca, tmp_path, "hs", ip_addresses=["127.0.0.1"])
    assert (ca.certificate.read_bytes(), leaf.certificate.read_bytes()) == before


def test_a_leaf_is_replaced_when_its_addresses_or_its_ca_change(tmp_path: Path) -> None:
    ca = tls.ensure_ca(tmp_path / "ca")
    leaf = tls.ensure_server_certificate(ca, tmp_path, "hs", ip_addresses=["127.0.0.1"])
    first = leaf.certificate.read_bytes()
    tls.ensure_server_certificate(ca, tmp_path, "hs", ip_addresses=["127.0.0.1"], dns_names=["x"])
    second = leaf.certificate.read_bytes()
    assert second != first
    other = tls.ensure_ca(tmp_path / "other")
    tls.ensure_server_certificate(
        other, tmp_path, "hs", ip_addresses=["127.0.0.1"], dns_names=["x"]
    )
    _cert(leaf.certificate).verify_directly_issued_by(_cert(other.certificate))


def test_files_close_to_expiry_or_damaged_are_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ca = tls.ensure_ca(tmp_path)
    first = ca.certificate.read_bytes()
    later = datetime.datetime.now(datetime.UTC) + tls.CA_LIFETIME - tls.RENEW_BEFORE / 2
    monkeypatch.setattr(tls, "_now", lambda: later)
    tls.ensure_ca(tmp_path)
    assert ca.certificate.read_bytes() != first
    monkeypatch.undo()
    ca.private_key.write_text("not a key")
    tls.ensure_ca(tmp_path)
    assert _cert(ca.certificate).public_key() is not None
    assert ca.private_key.read_text().startswith("-----BEGIN PRIVATE KEY-----")


def test_the_blocklist_lets_exactly_the_peers_through() -> None:
    assert blocklist_except([]) == list(SYNAPSE_DEFAULT_BLOCKLIST)
    nets = [ipaddress.ip_network(n) for n in blocklist_except(["127.0.0.1"])]

    def blocked(address: str) -> bool:
        return any(ipaddress.ip_address(address) in net for net in nets)

    assert not blocked("127.0.0.1")
    assert all(blocked(a) for a in ["127.0.0.2", "127.255.255.255", "10.0.0.1", "::1"])

"""Certificates for local homeservers that federate: a private CA and a leaf per homeserver.

Matrix federation runs over TLS only, and Synapse verifies the peer's certificate; on one machine
the peers trust a CA of our own (Synapse's `federation_custom_ca_list`). Files are reused while
they are valid, so restarting the local stack keeps the same certificates.
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from ..private_files import private_dir, write_private

CA_LIFETIME = datetime.timedelta(days=3650)
LEAF_LIFETIME = datetime.timedelta(days=365)
# Files this close to expiry are replaced rather than reused, so a running stack never sees one
# expire under it.
RENEW_BEFORE = datetime.timedelta(days=30)


@dataclass(frozen=True)
class KeyPair:
    certificate: Path
    private_key: Path


def ensure_ca(directory: Path) -> KeyPair:
    """The local CA in ``directory`` (`ca.crt`, `ca.key`), created unless a valid one is there."""
    pair = KeyPair(directory / "ca.crt", directory / "ca.key")
    if _loaded(pair) is not None:
        return pair
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "rethink-mn local federation CA")])
    now = _now()
    public = key.public_key()
    cert = (
        _validity(x509.CertificateBuilder(), now, CA_LIFETIME)
        .subject_name(name)
        .issuer_name(name)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write(pair, cert, key)
    return pair


def ensure_server_certificate(
    ca: KeyPair,
    directory: Path,
    name: str,
    *,
    ip_addresses: Iterable[str] = (),
    dns_names: Iterable[str] = (),
) -> KeyPair:
    """A server certificate signed by ``ca`` for exactly these addresses, as `<name>.crt` and
    `<name>.key` in ``directory``; the files there are reused when they still fit."""
    ips = frozenset(ipaddress.ip_address(ip) for ip in ip_addresses)
    dns = frozenset(dns_names)
    if not ips and not dns:
        raise ValueError("a server certificate needs at least one address")
    ca_loaded = _loaded(ca)
    if ca_loaded is None:
        raise ValueError(f"no valid CA at {ca.certificate}")
    ca_cert, ca_key = ca_loaded
    pair = KeyPair(directory / f"{name}.crt", directory / f"{name}.key")
    current = _loaded(pair)
    if current is not None and _fits(current[0], ca_cert, ips, dns):
        return pair
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    sans: list[x509.GeneralName] = [x509.DNSName(d) for d in sorted(dns)]
    sans += [x509.IPAddress(ip) for ip in sorted(ips, key=str)]
    cert = (
        _validity(x509.CertificateBuilder(), now, LEAF_LIFETIME)
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    _write(pair, cert, key)
    return pair


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _validity(
    builder: x509.CertificateBuilder, now: datetime.datetime, lifetime: datetime.timedelta
) -> x509.CertificateBuilder:
    # Backdated a little: a certificate made a moment ago must already be valid to a peer.
    return builder.not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(
        now + lifetime
    )


def _loaded(pair: KeyPair) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None:
    """The pair when both files are there, belong together and are not about to expire."""
    try:
        cert = x509.load_pem_x509_certificate(pair.certificate.read_bytes())
        key = serialization.load_pem_private_key(pair.private_key.read_bytes(), password=None)
    except (OSError, ValueError):
        return None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        return None
    if cert.public_key() != key.public_key():
        return None
    now = _now()
    if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc - RENEW_BEFORE:
        return None
    return cert, key


def _fits(
    cert: x509.Certificate,
    ca_cert: x509.Certificate,
    ips: frozenset[ipaddress.IPv4Address | ipaddress.IPv6Address],
    dns: frozenset[str],
) -> bool:
    try:
        cert.verify_directly_issued_by(ca_cert)
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, TypeError, InvalidSignature, x509.ExtensionNotFound):
        return False
    return (
        frozenset(sans.get_values_for_type(x509.IPAddress)) == ips
        and frozenset(sans.get_values_for_type(x509.DNSName)) == dns
    )


def _write(pair: KeyPair, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> None:
    # Written aside and renamed (a reader, or an interrupted run, never sees half a file), in a
    # 0700 directory, owner-only from creation. The certificate is no secret, but only the
    # homeservers (run by the same user) read it, and the local stack's state is owner-only
    # throughout, so that tightening an existing install finds nothing to change.
    private_dir(pair.certificate.parent)
    write_private(
        pair.private_key,
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    )
    write_private(pair.certificate, cert.public_bytes(serialization.Encoding.PEM))

"""Confidentiality on the wire: a CA per federation, a certificate per service and one
for the broker, and the TLS contexts that use them.

``megha up`` (and ``python -m deploy.render secrets``) makes, once, under
``$MEGHA_HOME/tls``: ``ca.pem`` and ``ca.key`` (the federation's own CA, ECDSA P-256,
10 years), and for each service process and the broker ``<name>.pem`` / ``<name>.key``
naming its host (a DNS name, or an IP address) and ``localhost``/``127.0.0.1``.
Keys are 0600; the CA's key stays with the operator (no service is given it).

Guarantees:

* a client trusts only the federation's CA (``client_context``: not the system's
  roots), checks the server's name against its certificate, and speaks TLS 1.2 or
  later; a server refuses anything older;
* what exists is kept: a CA is never replaced (every certificate would change), a
  certificate is made again only when it is missing or names other hosts.

``cryptography`` (a dependency of the test tools already, and pip's wheel on every
platform we run) makes them: no ``openssl`` binary, no shelling out, the same on a
container without one.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import ssl
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import quote, urlsplit

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from common.config import TLS_CA_ENV, TLS_DIRNAME, FederationConfig
from security.files import ensure_private_dir, read_private, write_private

CA_ENV = TLS_CA_ENV
"""A process's trust anchor: the federation CA's certificate (``megha up`` sets it)."""
CA_CERT, CA_KEY = "ca.pem", "ca.key"
VALID_DAYS_CA = 3650
VALID_DAYS_LEAF = 825
LOCAL_NAMES = ("localhost", "127.0.0.1", "::1")


def tls_dir(home: Path) -> Path:
    return home / TLS_DIRNAME


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common[:64])])


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _load_key(path: Path) -> ec.EllipticCurvePrivateKey:
    key = serialization.load_pem_private_key(read_private(path), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{path}: not an EC key")
    return key


def ensure_ca(directory: Path, federation: str) -> Path:
    """``directory/ca.pem`` (made with its key if missing); its path."""
    ensure_private_dir(directory)
    cert_path, key_path = directory / CA_CERT, directory / CA_KEY
    if cert_path.exists() and key_path.exists():
        return cert_path
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    name = _name(f"megha {federation} CA")
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=VALID_DAYS_CA))
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
        .sign(key, hashes.SHA256())
    )
    write_private(key_path, _key_pem(key))
    write_private(cert_path, cert.public_bytes(serialization.Encoding.PEM))
    return cert_path


def _alt_names(hosts: Iterable[str]) -> list[x509.GeneralName]:
    out: list[x509.GeneralName] = []
    for h in dict.fromkeys([*hosts, *LOCAL_NAMES]):
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            out.append(x509.DNSName(h))
    return out


def _names_of(path: Path) -> set[str]:
    cert = x509.load_pem_x509_certificate(path.read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return {str(v) for v in san.get_values_for_type(x509.DNSName)} | {
        str(v) for v in san.get_values_for_type(x509.IPAddress)
    }


def ensure_leaf(directory: Path, name: str, hosts: Iterable[str]) -> tuple[Path, Path]:
    """``directory/<name>.pem`` and ``.key``, signed by the CA, for ``hosts`` (made
    again only if missing or naming other hosts)."""
    cert_path, key_path = directory / f"{name}.pem", directory / f"{name}.key"
    wanted = _alt_names(hosts)
    want = {str(g.value) for g in wanted}
    if cert_path.exists() and key_path.exists() and _names_of(cert_path) == want:
        return cert_path, key_path
    ca_key = _load_key(directory / CA_KEY)
    ca = x509.load_pem_x509_certificate((directory / CA_CERT).read_bytes())
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(name))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=VALID_DAYS_LEAF))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(wanted), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    write_private(key_path, _key_pem(key))
    write_private(cert_path, cert.public_bytes(serialization.Encoding.PEM))
    return cert_path, key_path


def client_context(ca: Path | str) -> ssl.SSLContext:
    """Trusts the federation's CA only; checks names; TLS 1.2+."""
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(ca))
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


def server_context(cert: Path, key: Path) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(str(cert), str(key))
    return ctx


_CONTEXTS: dict[str, ssl.SSLContext] = {}


def process_client_context() -> ssl.SSLContext | None:
    """This process's client context from ``$MEGHA_TLS_CA`` (None: not set), made once."""
    ca = os.environ.get(CA_ENV, "")
    if not ca:
        return None
    ctx = _CONTEXTS.get(ca)
    if ctx is None:
        ctx = _CONTEXTS[ca] = client_context(ca)
    return ctx


def trust_home(home: Path) -> None:
    """An operator's process (``megha status``, ``bench``...) trusts the CA of the
    federation in ``home``, if it has one (the last such federation it acted on)."""
    ca = tls_dir(home) / CA_CERT
    if ca.exists():
        os.environ[CA_ENV] = str(ca)


def amqps_url(url: str) -> str:
    """``url`` with the process's CA as its ``cafile`` when it is ``amqps://`` and names
    none (aiormq reads ``cafile`` from the query)."""
    ca = os.environ.get(CA_ENV, "")
    if not url.startswith("amqps://") or not ca or "cafile=" in url:
        return url
    return f"{url}{'&' if '?' in url else '?'}cafile={quote(ca, safe='')}"


def make_federation_tls(cfg: FederationConfig, home: Path) -> list[Path]:
    """The CA, a certificate for every process of ``cfg`` (its host) and one for the
    broker (its nodes' hosts), under ``home/tls``; what exists and fits is kept."""
    d = tls_dir(home)
    made = [ensure_ca(d, cfg.name)]
    for name in cfg.process_names:
        made.extend(ensure_leaf(d, name, [cfg.address(name)[0]]))
    broker_hosts = sorted({urlsplit(u).hostname or "127.0.0.1" for u in cfg.broker_urls})
    made.extend(ensure_leaf(d, "broker", broker_hosts))
    return made

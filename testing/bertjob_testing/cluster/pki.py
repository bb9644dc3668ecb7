"""The test cluster's certificates: one CA, the API server's serving certificate, client
certificates for users (Kubernetes reads the user from the common name and the groups from the
organizations), and the service-account signing key. Made with ``cryptography``; files in PEM.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALID = datetime.timedelta(days=2)


@dataclass(frozen=True)
class KeyPair:
    """A certificate and its private key, as PEM files."""

    cert: Path
    key: Path


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    path.chmod(0o600)


class CertificateAuthority:
    """A self-signed CA in ``directory`` (made if missing: ``ca.crt``, ``ca.key``) that issues the others."""

    def __init__(self, directory: Path, name: str = "bertjob-test-ca") -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self._key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.UTC)
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + VALID)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self._key, hashes.SHA256())
        )
        self.cert = directory / "ca.crt"
        self.cert.write_bytes(self._cert.public_bytes(serialization.Encoding.PEM))
        _write_key(directory / "ca.key", self._key)

    @classmethod
    def load(cls, directory: Path) -> CertificateAuthority:
        """The CA another object made in ``directory`` (its ``ca.crt`` and ``ca.key``), to issue
        more certificates of it (the real node's kubelet, under the control plane's CA).

        Raises:
            FileNotFoundError: no CA there.
        """
        authority = cls.__new__(cls)
        authority.directory = directory
        authority.cert = directory / "ca.crt"
        authority._cert = x509.load_pem_x509_certificate(authority.cert.read_bytes())
        key = serialization.load_pem_private_key((directory / "ca.key").read_bytes(), password=None)
        assert isinstance(key, ec.EllipticCurvePrivateKey)
        authority._key = key
        return authority

    def issue(
        self,
        name: str,
        common_name: str,
        organizations: tuple[str, ...] = (),
        hosts: tuple[str, ...] = (),
        server: bool = False,
    ) -> KeyPair:
        """A certificate ``<name>.crt`` / ``<name>.key`` for ``common_name`` (a user, or a
        server's name) in ``organizations`` (a user's groups), valid for ``hosts`` (DNS names
        or IP addresses) when ``server``, else for client authentication."""
        key = ec.generate_private_key(ec.SECP256R1())
        attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
        attributes += [x509.NameAttribute(NameOID.ORGANIZATION_NAME, group) for group in organizations]
        now = datetime.datetime.now(datetime.UTC)
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attributes))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + VALID)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if hosts:
            names: list[x509.GeneralName] = []
            for host in hosts:
                try:
                    names.append(x509.IPAddress(ipaddress.ip_address(host)))
                except ValueError:
                    names.append(x509.DNSName(host))
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        pair = KeyPair(self.directory / f"{name}.crt", self.directory / f"{name}.key")
        pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(pair.key, key)
        return pair


def service_account_keys(directory: Path) -> KeyPair:
    """The key that signs service-account tokens (``sa.key``) and its public half (``sa.pub``,
    in ``cert``): RSA, as the API server's ``--service-account-*-file`` flags take."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pair = KeyPair(directory / "sa.pub", directory / "sa.key")
    _write_key(pair.key, key)
    pair.cert.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return pair

"""The serving certificate of the progress endpoint, kept by the operator in a Secret of its own.

The trainers of every namespace check the operator's certificate against a CA that the operator
puts in each job's ConfigMap, so every replica must serve the same certificate and the CA must
outlive any one replica. The chart ships no key (its manifests/ render has none to leak into git,
and ``kubectl apply -k manifests/`` installs the same thing): the first replica to start makes a
CA and a certificate for the endpoint's host names and creates the Secret; a replica that finds
it reads it, and one that loses the race to create it (409) reads the winner's. As Kueue's and
Kubeflow Trainer's controllers keep their webhook certificates (open-policy-agent/cert-controller),
without the rotation: the certificate lasts :data:`VALIDITY_DAYS`; delete the Secret and restart
the operator to make a new one (docs/operator.md).
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from kubernetes.client import ApiClient, CoreV1Api, V1ObjectMeta, V1Secret
from kubernetes.client.exceptions import ApiException

VALIDITY_DAYS = 3650
CA_KEY, CERT_KEY, PRIVATE_KEY = "ca.crt", "tls.crt", "tls.key"


@dataclass(frozen=True)
class Certificate:
    """A serving certificate as PEM text: ``ca`` (what clients trust), ``cert`` and ``key``."""

    ca: str
    cert: str
    key: str


def make(hosts: Sequence[str], days: int = VALIDITY_DAYS) -> Certificate:
    """A new self-signed CA and a certificate it signs for ``hosts`` (DNS names or IP
    addresses, the first also the subject's common name), both valid ``days`` days, with P-256
    keys (RFC 5480), as Helm's ``genCA``/``genSignedCert`` make the webhook's.

    Raises:
        ValueError: no host.
    """
    if not hosts:
        raise ValueError("a certificate needs at least one host name")
    now = datetime.datetime.now(datetime.UTC)
    not_after = now + datetime.timedelta(days=days)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "bertjob-progress-ca")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(not_after)
        .add_extension(x509.SubjectAlternativeName([_general_name(host) for host in hosts]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([x509.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return Certificate(
        ca=ca_cert.public_bytes(serialization.Encoding.PEM).decode(),
        cert=cert.public_bytes(serialization.Encoding.PEM).decode(),
        key=key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ).decode(),
    )


def covers(certificate: Certificate, hosts: Sequence[str], now: datetime.datetime | None = None) -> bool:
    """Whether ``certificate`` names every one of ``hosts`` and is valid for a day more."""
    cert = x509.load_pem_x509_certificate(certificate.cert.encode())
    try:
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    named = {str(value) for value in names.get_values_for_type(x509.DNSName)}
    named |= {str(value) for value in names.get_values_for_type(x509.IPAddress)}
    later = (now or datetime.datetime.now(datetime.UTC)) + datetime.timedelta(days=1)
    return set(hosts) <= named and cert.not_valid_after_utc > later


def kept(api: ApiClient, namespace: str, name: str, hosts: Sequence[str]) -> Certificate:
    """The certificate in the Secret ``namespace/name``: read when it holds one that
    :func:`covers` ``hosts``, else made (:func:`make`) and stored there, created or replaced.
    Two replicas starting at once agree: the loser of the create (409 Conflict) or of the
    replace (409, a changed resourceVersion) reads the winner's.

    Raises:
        kubernetes.client.exceptions.ApiException: the API server refused other than with 409
            (e.g. 403: the operator's Role lacks ``get`` or ``create`` on this Secret).
    """
    core = CoreV1Api(api)
    for _ in range(3):
        secret = _read(core, namespace, name)
        found = _certificate(secret)
        if found is not None and covers(found, hosts):
            return found
        made = make(hosts)
        meta = V1ObjectMeta(name=name, namespace=namespace)
        body = V1Secret(
            api_version="v1",
            kind="Secret",
            type="kubernetes.io/tls",
            metadata=meta,
            data={
                key: base64.b64encode(value.encode()).decode()
                for key, value in ((CA_KEY, made.ca), (CERT_KEY, made.cert), (PRIVATE_KEY, made.key))
            },
        )
        try:
            if secret is None:
                core.create_namespaced_secret(namespace, body)
            else:
                meta.resource_version = secret.metadata.resource_version
                core.replace_namespaced_secret(name, namespace, body)
        except ApiException as error:
            if error.status == 409:
                continue
            raise
        return made
    raise ApiException(status=409, reason=f"the Secret {namespace}/{name} kept changing while it was written")


def _read(core: CoreV1Api, namespace: str, name: str) -> Any:
    try:
        return core.read_namespaced_secret(name, namespace)
    except ApiException as error:
        if error.status == 404:
            return None
        raise


def _certificate(secret: Any) -> Certificate | None:
    data = (secret.data or {}) if secret is not None else {}
    if not all(key in data for key in (CA_KEY, CERT_KEY, PRIVATE_KEY)):
        return None
    text = {key: base64.b64decode(data[key]).decode() for key in (CA_KEY, CERT_KEY, PRIVATE_KEY)}
    try:
        x509.load_pem_x509_certificate(text[CERT_KEY].encode())
    except ValueError:
        return None
    return Certificate(ca=text[CA_KEY], cert=text[CERT_KEY], key=text[PRIVATE_KEY])


def _general_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)

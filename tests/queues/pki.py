"""Certificates for the TLS broker tests, made at test time with openssl (and the JDK's keytool
for the broker's truststore): a CA, the broker's certificate for `localhost` only (so
127.0.0.1 is a host-name mismatch), a client certificate, and a second CA that signed none."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

STORE_PASSWORD = "sis-test-store"  # the test broker's keystore and truststore, nothing else
_KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]


@dataclass(frozen=True)
class Pki:
    ca_file: Path  # the CA that signed the broker's and the client's certificates
    other_ca_file: Path  # a CA that signed neither
    broker_keystore: Path  # PKCS12: the broker's key and certificate chain
    broker_truststore: Path  # PKCS12: the CA the broker accepts client certificates from
    client_cert: Path
    client_key: Path
    client_encrypted_key: Path  # the client key under CLIENT_KEY_PASSWORD
    store_password: str = STORE_PASSWORD


CLIENT_KEY_PASSWORD = "client-key-secret"


def _run(*command: str | Path) -> None:
    # Passwords reach openssl and keytool through the environment, not their command lines.
    env = {**os.environ, "STORE_PASSWORD": STORE_PASSWORD, "KEY_PASSWORD": CLIENT_KEY_PASSWORD}
    result = subprocess.run(
        [str(c) for c in command], capture_output=True, text=True, timeout=60, check=False, env=env
    )
    if result.returncode != 0:
        pytest.fail(f"{' '.join(map(str, command))} failed:\n{result.stderr}", pytrace=False)


def _ca(folder: Path, name: str) -> tuple[Path, Path]:
    key, cert = folder / f"{name}.key", folder / f"{name}.pem"
    _run(
        *("openssl", "req", "-x509", *_KEY, "-keyout", key, "-out", cert, "-days", "2"),
        *("-subj", f"/CN=sis test {name}"),
        *("-addext", "basicConstraints=critical,CA:TRUE"),
        *("-addext", "keyUsage=critical,keyCertSign,cRLSign"),
    )
    return key, cert


def _leaf(folder: Path, name: str, ca: tuple[Path, Path], extensions: str) -> tuple[Path, Path]:
    key, csr, cert = folder / f"{name}.key", folder / f"{name}.csr", folder / f"{name}.pem"
    ext = folder / f"{name}.ext"
    ext.write_text(
        "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n"
        "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid,issuer\n" + extensions
    )
    _run("openssl", "req", *_KEY, "-keyout", key, "-out", csr, "-subj", f"/CN={name}")
    ca_key, ca_cert = ca
    _run(
        *("openssl", "x509", "-req", "-in", csr, "-CA", ca_cert, "-CAkey", ca_key),
        *("-CAcreateserial", "-out", cert, "-days", "2", "-extfile", ext),
    )
    return key, cert


def make_pki(folder: Path) -> Pki:
    folder.mkdir(parents=True, exist_ok=True)
    ca = _ca(folder, "ca")
    _, other_ca = _ca(folder, "other-ca")
    broker_key, broker_cert = _leaf(
        folder, "localhost", ca, "subjectAltName=DNS:localhost\nextendedKeyUsage=serverAuth\n"
    )
    client_key, client_cert = _leaf(folder, "client", ca, "extendedKeyUsage=clientAuth\n")
    encrypted = folder / "client-encrypted.key"
    _run(
        *("openssl", "pkey", "-in", client_key, "-out", encrypted, "-aes256"),
        *("-passout", "env:KEY_PASSWORD"),
    )
    keystore, truststore = folder / "broker.p12", folder / "trust.p12"
    _run(
        *("openssl", "pkcs12", "-export", "-in", broker_cert, "-inkey", broker_key),
        *("-certfile", ca[1], "-name", "broker", "-out", keystore),
        *("-passout", "env:STORE_PASSWORD"),
    )
    # A truststore openssl writes holds no entry Java trusts; keytool's does.
    _run(
        *("keytool", "-importcert", "-noprompt", "-alias", "ca", "-file", ca[1]),
        *("-keystore", truststore, "-storetype", "pkcs12", "-storepass:env", "STORE_PASSWORD"),
    )
    return Pki(
        ca_file=ca[1],
        other_ca_file=other_ca,
        broker_keystore=keystore,
        broker_truststore=truststore,
        client_cert=client_cert,
        client_key=client_key,
        client_encrypted_key=encrypted,
    )

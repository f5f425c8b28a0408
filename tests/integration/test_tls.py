"""HTTPS: a real control-plane server started with a certificate made here (a test CA signs it;
nothing is downloaded). The CLI verifies it against the CA it is given (``--ca``,
``AICLUSTER_CA`` or what ``aicluster up --ca`` recorded) and refuses it otherwise with a
readable error; a plain-HTTP client gets nothing from the TLS port."""

from __future__ import annotations

import datetime
import ipaddress
import json
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from serverproc import REPO, ServerProcess, admin_token, servers_cleanup
from typer.testing import CliRunner

from aicluster.cli.main import app

pytestmark = pytest.mark.integration


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def make_ca(folder: Path, name: str) -> tuple[Path, x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _key()
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
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
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    path = folder / f"{name}.pem"
    path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    return path, certificate, key


def make_server_cert(
    folder: Path, ca: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey
) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and localhost signed by ``ca``; returns (cert, key) files."""
    key = _key()
    now = datetime.datetime.now(datetime.UTC)
    names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    certificate = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    cert_path, key_path = folder / "server.pem", folder / "server.key"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(_pem_key(key))
    key_path.chmod(0o600)
    return cert_path, key_path


class TlsServer(ServerProcess):
    """A control-plane server (no Ray) serving HTTPS, checked against ``ca``."""

    def __init__(self, state_dir: Path, log_dir: Path, cert: Path, key: Path, ca: Path) -> None:
        args = ("--tls-cert", str(cert), "--tls-key", str(key), "--ca", str(ca))
        super().__init__("tls", state_dir, log_dir, extra_args=args)
        self.url = f"https://127.0.0.1:{self.port}"
        self.ca = ca

    def health(self) -> dict[str, Any] | None:
        if not self.alive():
            return None
        verify = ssl.create_default_context(cafile=str(self.ca))
        try:
            response = httpx.get(f"{self.url}/healthz", timeout=5, verify=verify)
        except httpx.HTTPError:
            return None
        return dict(response.json()) if response.status_code == 200 else None


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("pki")
    ca_path, ca, ca_key = make_ca(folder, "test-ca")
    other_path, _, _ = make_ca(folder, "other-ca")
    cert, key = make_server_cert(folder, ca, ca_key)
    not_pem = folder / "not-a-ca.pem"
    not_pem.write_text("not a certificate\n")
    return {"ca": ca_path, "other_ca": other_path, "cert": cert, "key": key, "not_pem": not_pem}


@pytest.fixture(scope="module")
def server(pki: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsServer]:
    work = tmp_path_factory.mktemp("tls")
    running = TlsServer(work / "state", work, pki["cert"], pki["key"], pki["ca"])
    with servers_cleanup(running):
        running.start(timeout_s=120)
        yield running


def run_cli(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args), env=env)
    assert not isinstance(result.exception, Exception) or isinstance(
        result.exception, SystemExit
    ), result.exception
    return result.exit_code, " ".join(result.output.split())  # Rich wraps long lines


def test_the_cli_verifies_the_server_against_the_ca_it_is_given(
    server: TlsServer, pki: dict[str, Path]
) -> None:
    token = admin_token(server.state_dir)
    target = ["--url", server.url, "--token", token]
    code, out = run_cli("jobs", *target, "--ca", str(pki["ca"]))
    assert code == 0 and "no jobs" in out, out
    code, out = run_cli("jobs", *target, env={"AICLUSTER_CA": str(pki["ca"])})
    assert code == 0 and "no jobs" in out, out
    local = ["--url", f"https://localhost:{server.port}", "--token", token, "--ca", str(pki["ca"])]
    assert run_cli("jobs", *local)[0] == 0  # the certificate names localhost too

    # Without the CA (the system's CAs do not know it), or with another CA: refused, readably.
    for extra in ([], ["--ca", str(pki["other_ca"])]):
        code, out = run_cli("jobs", *target, *extra, env={"AICLUSTER_CA": ""})
        assert code == 1, out
        assert "certificate does not verify" in out and "--ca FILE" in out, out
        assert "Traceback" not in out
    code, out = run_cli("jobs", *target, "--ca", str(pki["not_pem"]))
    assert code == 1 and "cannot load it as PEM CA certificates" in out and "Traceback" not in out
    code, out = run_cli("jobs", *target, "--ca", str(pki["ca"].with_name("missing.pem")))
    assert code != 0 and "Traceback" not in out, out


def test_the_cli_finds_the_url_and_ca_that_the_server_recorded(server: TlsServer) -> None:
    info = json.loads((server.state_dir / "server.json").read_text())
    assert info["url"] == server.url and info["ca"] == str(server.ca)
    code, out = run_cli("jobs", "--home", str(server.state_dir), env={"AICLUSTER_CA": ""})
    assert code == 0 and "no jobs" in out, out


def test_plain_http_to_the_tls_port_gets_nothing(server: TlsServer) -> None:
    token = admin_token(server.state_dir)
    plain = f"http://127.0.0.1:{server.port}"
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/yaml"}
    with pytest.raises(httpx.HTTPError):
        httpx.post(f"{plain}/v1/jobs", content="name: a\nmodule: t\n", headers=headers)
    code, out = run_cli("jobs", "--url", plain, "--token", token)
    assert code == 1 and "https://" in out and "Traceback" not in out, out
    verify = ssl.create_default_context(cafile=str(server.ca))
    jobs = httpx.get(f"{server.url}/v1/jobs", headers=headers, verify=verify).json()
    assert jobs["jobs"] == []  # the plain request created nothing


def test_up_wants_both_files_and_the_server_checks_they_match(
    pki: dict[str, Path], tmp_path: Path
) -> None:
    home = ["--home", str(tmp_path / "home")]
    code, out = run_cli("up", "--tls-cert", str(pki["cert"]), *home)
    assert code == 2 and "give both --tls-cert and --tls-key" in out, out
    code, out = run_cli("up", "--tls-key", str(pki["key"]), *home)
    assert code == 2 and "give both --tls-cert and --tls-key" in out, out
    code, out = run_cli("up", "--ca", str(pki["ca"]), *home)
    assert code == 2 and "--ca names the CA of --tls-cert" in out, out
    missing = str(tmp_path / "missing.pem")
    code, out = run_cli("up", "--tls-cert", missing, "--tls-key", str(pki["key"]), *home)
    assert code == 2 and "no such file" in out, out
    code, out = run_cli("up", "--tls-cert", str(pki["cert"]), "--tls-key", str(pki["key"]),
                        "--ca", str(pki["not_pem"]), *home)  # fmt: skip
    assert code == 2 and "cannot load it as PEM" in out, out
    # The server itself: a key that is not the certificate's is a readable refusal.
    other_key = tmp_path / "other.key"
    other_key.write_bytes(_pem_key(_key()))
    done = subprocess.run(
        [sys.executable, "-m", "aicluster.server", "--state-dir", str(tmp_path / "s"),
         "--insecure-no-sandbox", "--tls-cert", str(pki["cert"]), "--tls-key", str(other_key)],
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "cannot serve HTTPS" in done.stderr and "Traceback" not in done.stderr


def test_up_serves_https_and_the_local_cli_trusts_the_ca_it_was_given(
    ray_cluster: Any, pki: dict[str, Path], tmp_path: Path
) -> None:
    from apiserver import free_port

    home = tmp_path / "home"
    base = ["--ray-address", ray_cluster.address, "--insecure-no-sandbox", "--home", str(home)]
    tls = ["--tls-cert", str(pki["cert"]), "--tls-key", str(pki["key"])]
    try:
        # A certificate that this machine does not trust: up says so at once and stops it.
        code, out = run_cli("up", *base, "--port", str(free_port()), *tls, env={"AICLUSTER_CA": ""})
        assert code == 1 and "certificate does not verify here" in out, out
        assert "Traceback" not in out
        code, out = run_cli("up", *base, "--port", str(free_port()), *tls, "--ca", str(pki["ca"]))
        assert code == 0 and "aicluster is up: API https://127.0.0.1:" in out, out
        code, out = run_cli("status", "--home", str(home), env={"AICLUSTER_CA": ""})
        assert code == 0 and "nodes healthy" in out, out
    finally:
        run_cli("down", "--home", str(home))

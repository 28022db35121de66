"""Error paths of sparkafka.broker.tls: keystore files that are missing, not files, unreadable or not
PEM text are refused when the listener's context is built, naming the option that gave them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sparkafka.broker.config import SslListener
from sparkafka.broker.tls import TlsConfigError, server_context

# _read checks files before anything parses them: a marker line passes the certificate check.
CERTIFICATE_TEXT = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"


def listener(certfile: Path, keyfile: Path | None = None) -> SslListener:
    return SslListener("127.0.0.1", 0, certfile, keyfile)


def test_a_missing_certificate_file_is_named_with_its_option(tmp_path: Path) -> None:
    missing = tmp_path / "broker.pem"
    with pytest.raises(
        TlsConfigError,
        match=f"^--ssl-certfile {re.escape(str(missing))}: no such file \\(the certificate chain, PEM\\)$",
    ):
        server_context(listener(missing))


def test_a_directory_given_as_the_key_file_is_not_a_file(tmp_path: Path) -> None:
    certfile = tmp_path / "broker.pem"
    certfile.write_text(CERTIFICATE_TEXT)
    with pytest.raises(
        TlsConfigError,
        match=f"^--ssl-keyfile {re.escape(str(tmp_path))}: not a file \\(the private key, PEM\\)$",
    ):
        server_context(listener(certfile, tmp_path))


def test_a_binary_keystore_is_refused_with_how_to_convert_it(tmp_path: Path) -> None:
    keystore = tmp_path / "broker.p12"
    keystore.write_bytes(b"\x30\x82\x0a\x3c\x02\x01\x03\xff\xfe")
    with pytest.raises(TlsConfigError) as raised:
        server_context(listener(keystore))
    assert str(raised.value) == (
        f"--ssl-certfile {keystore}: not PEM text (a JKS or PKCS12 keystore?): the certificate chain must be "
        "PEM; convert a PKCS12 file with `openssl pkcs12 -in FILE -nodes`"
    )


def test_a_key_in_the_certificate_file_is_named_by_both_options(tmp_path: Path) -> None:
    certfile = tmp_path / "broker.pem"
    certfile.write_text(CERTIFICATE_TEXT)
    with pytest.raises(
        TlsConfigError, match=r"^--ssl-certfile \(no --ssl-keyfile\) .*: holds no PEM private key$"
    ):
        server_context(listener(certfile))


@pytest.mark.skipif(not Path("/proc/self/mem").is_file(), reason="needs Linux's /proc")
def test_a_key_file_the_os_fails_to_read_is_refused_with_the_os_reason(tmp_path: Path) -> None:
    # A regular file whose read fails (EIO at offset 0) whoever reads it, root included.
    certfile = tmp_path / "broker.pem"
    certfile.write_text(CERTIFICATE_TEXT)
    with pytest.raises(
        TlsConfigError,
        # Not a permissions matter, so the message does not send the user to chmod.
        match=(
            r"^--ssl-keyfile /proc/self/mem: could not be read \(Input/output error\): "
            r"check the file and its disk$"
        ),
    ):
        server_context(listener(certfile, Path("/proc/self/mem")))


def test_a_certificate_file_the_disk_fails_to_read_is_named_with_what_to_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    certfile = tmp_path / "broker.pem"
    certfile.write_text(CERTIFICATE_TEXT)

    def failing_read(self: Path) -> bytes:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(Path, "read_bytes", failing_read)
    with pytest.raises(
        TlsConfigError,
        match=f"^--ssl-certfile {re.escape(str(certfile))}: could not be read \\(Input/output error\\): "
        "check the file and its disk$",
    ):
        server_context(listener(certfile))


def test_a_key_file_the_broker_may_not_read_says_to_fix_its_permissions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    certfile = tmp_path / "broker.pem"
    certfile.write_text(CERTIFICATE_TEXT)
    keyfile = tmp_path / "broker.key"
    keyfile.write_text("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")
    real_read = Path.read_bytes

    def read_as_another_user(self: Path) -> bytes:
        if self == keyfile:  # root reads any file: the refusal a broker's own user would get
            raise PermissionError(13, "Permission denied")
        return real_read(self)

    monkeypatch.setattr(Path, "read_bytes", read_as_another_user)
    with pytest.raises(
        TlsConfigError,
        match=f"^--ssl-keyfile {re.escape(str(keyfile))}: cannot be read by the broker's user "
        "\\(Permission denied\\): fix its permissions$",
    ):
        server_context(listener(certfile, keyfile))

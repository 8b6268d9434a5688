"""Checks of the TLS file keys: a certificate and its key come as a pair, and every file named
must exist and load when the config is built, so `check-config` and the start-up refuse a bad
path by its key instead of a handshake failing later. Loading the files is gateway/tls.py's job.
"""

from __future__ import annotations

import ssl

from gateway.config.checks import check


def check_pair(cert: str, key: str) -> None:
    """`tls_cert` and `tls_key`: both or neither; both files load as a certificate chain and
    its private key. (`check` may record instead of raising: each step stands on its own.)"""
    if bool(cert) != bool(key):
        given, missing = ("tls_cert", "tls_key") if cert else ("tls_key", "tls_cert")
        check(False, missing, "", f"is missing: {given} is set to {cert or key!r}; {_PAIR}")
        return
    if not cert or not (_readable("tls_cert", cert) & _readable("tls_key", key)):
        return
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
    except (ssl.SSLError, OSError) as exc:
        check(False, "tls_cert", cert, f"does not load with tls_key {key!r}: {_reason(exc)}")


def check_ca(ca: str) -> None:
    """`tls_ca`: a PEM bundle of the certificate authorities to trust ("" = the system's)."""
    if not ca or not _readable("tls_ca", ca):
        return
    try:
        ssl.create_default_context().load_verify_locations(cafile=ca)
    except (ssl.SSLError, OSError) as exc:
        check(False, "tls_ca", ca, f"is not a PEM certificate bundle: {_reason(exc)}")


_PAIR = "give both (a certificate and its private key) or neither"


def _readable(name: str, path: str) -> bool:
    try:
        with open(path, "rb"):
            return True
    except OSError as exc:
        check(False, name, path, f"cannot be read: {exc.strerror or exc}")
        return False


_REASONS = {
    "KEY_VALUES_MISMATCH": "the key does not belong to the certificate",
    "PEM_LIB": "not a PEM certificate (chain) and PEM private key",
}


def _reason(exc: OSError) -> str:
    text = str(exc).upper()
    for code, meaning in _REASONS.items():
        if code in text or code.replace("_", " ") in text:
            return meaning
    reason = exc.reason if isinstance(exc, ssl.SSLError) else None
    return str(reason or exc.strerror or exc).lower().replace("_", " ")

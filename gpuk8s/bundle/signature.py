"""A bundle's own signature (optional): an OpenPGP detached signature beside the file (`FILE.asc`), made with the
builder's gpg key by `bundle create --sign-with KEY`, checked by gpgv against the public key the site was given
(`bundle verify --key`, `install --bundle-key`). The sha256 of every member (the manifest) says the bundle is whole;
the signature says who built it. With a key given, a missing or a bad signature refuses the bundle."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

from gpuk8s.errors import GpuK8sError

MAX_KEY = 1 << 20


class SignatureError(GpuK8sError):
    kind = "bundle"


def signature_path(path: Path) -> Path:
    return path.with_name(path.name + ".asc")


def sign(path: Path, key_id: str) -> Path:
    """FILE.asc: FILE signed by the builder's gpg secret key `key_id` (gpg asks for its passphrase, as it does)."""
    out = signature_path(path)
    r = subprocess.run(["gpg", "--batch", "--yes", "--armor", "--local-user", key_id, "--detach-sign", "-o",
                        str(out), str(path)], capture_output=True, text=True, timeout=3600)
    if r.returncode != 0:
        said = (r.stderr.strip().splitlines() or ["gpg failed"])[-1][:200]
        raise SignatureError(f"gpg could not sign {path.name} with {key_id[:64]!r}: {said}",
                             "name a secret key of this machine's gpg (gpg --list-secret-keys)")
    return out


def check(path: Path, key: Path) -> str:
    """Whether FILE.asc is a good signature of FILE by `key` (a public key file, armored or not): the signer's
    fingerprint, or SignatureError naming what is wrong."""
    sig = signature_path(path)
    if not sig.is_file():
        raise SignatureError(f"{path.name}: no signature beside it ({sig.name})",
                             "copy FILE.asc with the bundle, or build it with bundle create --sign-with KEY")
    try:
        data = key.read_bytes()[:MAX_KEY]
    except OSError as e:
        raise SignatureError(f"cannot read the key {key}: {e.strerror}", "pass the builder's public key file") from None
    with tempfile.TemporaryDirectory(prefix="gpuk8s-sig-") as tmp:
        ring = Path(tmp) / "ring.gpg"
        if data.lstrip().startswith(b"-----BEGIN"):
            r = subprocess.run(["gpg", "--batch", "--homedir", tmp, "--dearmor", "-o", str(ring)], input=data,
                               capture_output=True, timeout=60)
            if r.returncode != 0:
                raise SignatureError(f"{key}: not an OpenPGP public key", "pass the builder's public key file")
        else:
            ring.write_bytes(data)
        v = subprocess.run(["gpgv", "--status-fd", "1", "--keyring", str(ring), str(sig), str(path)],
                           capture_output=True, text=True, timeout=3600)
    valid = [line.split()[2] for line in v.stdout.splitlines() if line.startswith("[GNUPG:] VALIDSIG ")
             and len(line.split()) > 2]
    if v.returncode != 0 or not valid:
        said = (v.stderr.strip().splitlines() or ["gpgv failed"])[-1][:200]
        raise SignatureError(f"{path.name}: its signature is not a good one by the key {key.name} ({said})",
                             "do not install from it: copy the bundle and its .asc again from where it was built")
    return valid[0]

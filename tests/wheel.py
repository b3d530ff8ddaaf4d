"""Build gpuk8s as users get it (an sdist, and the wheel built from that sdist) and install the wheel into a fresh
virtual environment outside the checkout. Used by `make demo` and `make dist-venv` and by tests/packaging, so that
the artifact users install is the one that is run and tested, not the editable checkout.

    python -m tests.wheel VENV_DIR      # prints the path of VENV_DIR/bin/gpuk8s
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _replaceable(path: Path, marker: str) -> None:
    """Refuse to empty a directory that is not what this module made (a venv has pyvenv.cfg, a dist directory
    holds only gpuk8s archives): a wrong DIST_VENV must not cost anyone their files."""
    if not path.exists():
        return
    names = [p.name for p in path.iterdir()] if path.is_dir() else ["(not a directory)"]
    ok = marker in names if marker else all(n.startswith("gpuk8s-") for n in names)
    if names and not ok:
        raise RuntimeError(f"{path} exists and is not a gpuk8s {'venv' if marker else 'dist directory'}: "
                           "not replaced")


def build(out_dir: Path) -> tuple[Path, Path]:
    """sdist and wheel into out_dir (emptied first); `python -m build` builds the wheel from the sdist, so a
    file missing from the sdist is missing from the wheel too. Returns (sdist, wheel)."""
    _replaceable(out_dir, "")
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True)
    # the build runs in a copy: setuptools writes build/ and *.egg-info next to the sources
    with tempfile.TemporaryDirectory(prefix="gpuk8s-build-") as tmp:
        src = Path(tmp) / "src"
        tracked = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                                 check=True, capture_output=True).stdout.decode().split("\0")
        for rel in filter(None, tracked):
            p = ROOT / rel
            if p.is_file():
                (src / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(p, src / rel)
        subprocess.run([sys.executable, "-m", "build", "--outdir", str(out_dir), str(src)], check=True,
                       stdout=subprocess.DEVNULL)
    sdists = sorted(out_dir.glob("gpuk8s-*.tar.gz"))
    wheels = sorted(out_dir.glob("gpuk8s-*.whl"))
    if len(sdists) != 1 or len(wheels) != 1:
        raise RuntimeError(f"expected one sdist and one wheel in {out_dir}, found {sdists + wheels}")
    return sdists[0], wheels[0]


def wheel_names(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        return z.namelist()


def install(wheel: Path, venv: Path) -> Path:
    """A fresh virtual environment at `venv` with the wheel and its dependencies (from the package index);
    returns its gpuk8s executable."""
    _replaceable(venv, "pyvenv.cfg")
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    str(wheel)], check=True)
    exe = venv / "bin" / "gpuk8s"
    if not exe.exists():
        raise RuntimeError(f"the wheel installed no gpuk8s command in {venv}/bin")
    return exe


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    venv = Path(argv[0]).resolve()
    if venv == ROOT or ROOT in venv.parents:
        print(f"tests.wheel: {venv} is inside the checkout; the wheel is installed outside it", file=sys.stderr)
        return 2
    _, wheel = build(venv.parent / (venv.name + "-dist"))
    print(install(wheel, venv))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The bundle's SBOM: an SPDX 2.3 JSON document of what the bundle carries, from its manifest: each file as a package
(its bundle path, its sha256), with a purl where the caller knows what it is (a Debian or RPM package, an OCI image),
the document DESCRIBES each. Pure; `created` is passed in, so that the same bundle gives the same document."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any

from gpuk8s.bundle.manifest import Manifest

_ID = re.compile(r"[^A-Za-z0-9.-]")


def _spdx_id(path: str) -> str:
    """SPDXRef-<path with every other character as '-'>-<8 hex of its sha256>: unique and in the schema's pattern."""
    return f"SPDXRef-{_ID.sub('-', path)[:120]}-{hashlib.sha256(path.encode()).hexdigest()[:8]}"


def spdx(m: Manifest, created: str, purls: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The SPDX document of manifest `m`; `created`: "YYYY-MM-DDTHH:MM:SSZ"; `purls`: bundle path -> package URL
    (pkg:deb/ubuntu/kubeadm@1.30.2-1.1?arch=amd64)."""
    manifest_sha = hashlib.sha256(m.dumps().encode()).hexdigest()
    packages = []
    for path, entry in sorted(m.files.items()):
        name = path.rsplit("/", 1)[-1]
        p: dict[str, Any] = {"SPDXID": _spdx_id(path), "name": name, "packageFileName": path,
                             "downloadLocation": "NOASSERTION", "filesAnalyzed": False,
                             "checksums": [{"algorithm": "SHA256", "checksumValue": entry.sha256}]}
        purl = (purls or {}).get(path)
        if purl:
            p["externalRefs"] = [{"referenceCategory": "PACKAGE-MANAGER", "referenceType": "purl",
                                  "referenceLocator": purl}]
        packages.append(p)
    return {
        "spdxVersion": "SPDX-2.3", "dataLicense": "CC0-1.0", "SPDXID": "SPDXRef-DOCUMENT",
        "name": f"gpuk8s bundle for Kubernetes {m.kubernetes}",
        "documentNamespace": f"https://gpuk8s.invalid/spdx/bundle-{manifest_sha}",
        "creationInfo": {"created": created, "creators": [f"Tool: {m.created_by}"]},
        "packages": packages,
        "relationships": [{"spdxElementId": "SPDXRef-DOCUMENT", "relationshipType": "DESCRIBES",
                           "relatedSpdxElement": p["SPDXID"]} for p in packages],
    }

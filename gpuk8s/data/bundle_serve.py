#!/usr/bin/env python3
"""gpuk8s's bundle server, run on the serving host for the length of one gpuk8s run (docs/airgap.md).

Read-only, over plain HTTP on the cluster network, from an unpacked bundle (ROOT): the package repositories
(`/repos/...`), the CNI manifest (`/manifests/...`) and release archives (`/files/...`: cri-dockerd's) as
files, and the bundle's OCI image layout (`ROOT/images`) through the pull side of the OCI distribution API
(`/v2/NAME/manifests/REF`, `/v2/NAME/blobs/DIGEST`), so that containerd (and Docker) pulls from it as from any
registry mirror. NAME is an image's path without its registry (`nvidia/k8s-device-plugin`, `coredns/coredns`);
containerd's `ns` query parameter, or the one registry that has
the path, says which. Nothing is trusted to the network: apt checks every package against the repository's own
signature, containerd every blob against its digest.

It ends when its stdin ends: gpuk8s holds it over its SSH connection, so a run that ends, is killed or loses the
connection stops the server with it. With `--while FILE` (`--keep-serving`) it ends once FILE is gone instead
(looked at every second): the next run from a bundle, or the user, removes it. Standard library only, Python 3.6
and later (Alibaba Cloud Linux 3's).

usage: bundle_serve.py ROOT ADDRESS PORT [--while FILE]
"""

import json
import os
import re
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from socketserver import TCPServer, ThreadingMixIn
from urllib.parse import parse_qs, unquote, urlsplit

READY = "gpuk8s-bundle-serving"
STATIC = ("repos/", "manifests/", "files/")
CHUNK = 1 << 20
MAX_MANIFEST = 4 << 20
MAX_CONNECTIONS = 64  # clients served at once (a node pulls a few images at a time; apt one file at a time)
_DIGEST = re.compile(r"^sha256:([0-9a-f]{64})$")
_NAME = re.compile(r"^[a-z0-9]+(?:[._-]+[a-z0-9]+)*(?:/[a-z0-9]+(?:[._-]+[a-z0-9]+)*){0,15}$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")
_HOST = re.compile(r"^[A-Za-z0-9.-]{1,253}(?::[0-9]{1,5})?$")
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


def load_refs(root):
    """"PATH:TAG" -> {registry: descriptor} from the layout's index.json (ref.name "REGISTRY/PATH:TAG")."""
    refs = {}
    try:
        with open(os.path.join(root, "images", "index.json"), "rb") as f:
            index = json.loads(f.read(64 << 20).decode("utf-8"))
    except (OSError, ValueError):
        return refs
    for d in index.get("manifests", []) if isinstance(index, dict) else []:
        name = ((d.get("annotations") or {}) if isinstance(d, dict) else {}).get("org.opencontainers.image.ref.name")
        if not isinstance(name, str) or "/" not in name or not _DIGEST.match(str(d.get("digest", ""))):
            continue
        registry, rest = name.split("/", 1)
        refs.setdefault(rest, {})[registry] = d
    return refs


class Handler(BaseHTTPRequestHandler):
    server_version = "gpuk8s-bundle"
    sys_version = ""
    protocol_version = "HTTP/1.1"
    timeout = 120  # seconds a connection may stay silent (keep-alive included) before it is closed

    def log_message(self, format, *args):  # noqa: A002 - nothing is logged: the held channel has no reader
        pass

    def do_HEAD(self):
        self.answer(head=True)

    def do_GET(self):
        self.answer(head=False)

    def fail(self, code, head, errors=None):
        body = b"" if head else json.dumps({"errors": errors or [{"code": "NOT_FOUND", "message": "not found"}]}
                                           ).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body:
            self.wfile.write(body)

    def answer(self, head):
        parts = urlsplit(self.path)
        path = unquote(parts.path)
        if "\x00" in path or "\\" in path or len(path) > 4096:
            return self.fail(400, head)
        if path in ("/v2", "/v2/"):
            return self.send_file(None, "application/json", head, body=b"{}")
        if path.startswith("/v2/"):
            return self.registry(path[4:], parse_qs(parts.query).get("ns", [""])[0], head)
        rel = path.lstrip("/")
        if not rel.startswith(STATIC):
            return self.fail(404, head)
        return self.static(rel, head)

    def registry(self, rest, ns, head):
        for kind in ("/manifests/", "/blobs/"):
            if kind in rest:
                name, ref = rest.rsplit(kind, 1)
                break
        else:
            return self.fail(404, head)
        if not _NAME.match(name):
            return self.fail(404, head, [{"code": "NAME_INVALID", "message": "invalid repository name"}])
        blobs = os.path.join(self.server.root, "images", "blobs", "sha256")
        m = _DIGEST.match(ref)
        if kind == "/blobs/":
            if not m:
                return self.fail(404, head, [{"code": "DIGEST_INVALID", "message": "invalid digest"}])
            return self.send_file(os.path.join(blobs, m.group(1)), "application/octet-stream", head, ref)
        if m:  # a manifest by its digest: only a blob that is one (small, JSON, schemaVersion 2)
            path = os.path.join(blobs, m.group(1))
            mt = media_type(path)
            if mt is None:
                return self.fail(404, head, [{"code": "MANIFEST_UNKNOWN", "message": "manifest unknown"}])
            return self.send_file(path, mt, head, ref)
        if not _TAG.match(ref):
            return self.fail(404, head, [{"code": "TAG_INVALID", "message": "invalid tag"}])
        by_registry = self.server.refs.get(name + ":" + ref, {})
        d = by_registry.get(ns) if ns and _HOST.match(ns) else None
        if d is None and len(by_registry) == 1:
            d = next(iter(by_registry.values()))
        if d is None:
            return self.fail(404, head, [{"code": "MANIFEST_UNKNOWN", "message": "manifest unknown"}])
        digest = d["digest"]
        path = os.path.join(blobs, digest.split(":", 1)[1])
        return self.send_file(path, str(d.get("mediaType") or media_type(path) or OCI_MANIFEST), head, digest)

    def static(self, rel, head):
        root = self.server.root
        # apt asks a flat repository for BASE/./FILE (`deb URL /` and its Filename): "." and empty parts are
        # dropped as any web server drops them; ".." is never followed
        parts = [p for p in rel.split("/") if p not in ("", ".")]
        if not parts or ".." in parts:
            return self.fail(404, head)
        path = os.path.realpath(os.path.join(root, *parts))
        if not path.startswith(root + os.sep):
            return self.fail(404, head)
        return self.send_file(path, "application/octet-stream", head)

    def send_file(self, path, ctype, head, digest=None, body=None):
        f = None
        if body is None:
            try:
                if os.path.islink(path) or not os.path.isfile(path):
                    return self.fail(404, head)
                f = open(path, "rb")  # noqa: SIM115 - closed below, after the headers
                size = os.fstat(f.fileno()).st_size
            except OSError:
                return self.fail(404, head)
        else:
            size = len(body)
        try:
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(size))
            if digest:
                self.send_header("Docker-Content-Digest", digest)
            self.end_headers()
            if head:
                return None
            if body is not None:
                self.wfile.write(body)
                return None
            while True:
                chunk = f.read(CHUNK)
                if not chunk:
                    break
                self.wfile.write(chunk)
        finally:
            if f is not None:
                f.close()
        return None


def media_type(path):
    """A manifest's own mediaType (an index or a manifest) for a manifest asked for by its digest; None when the
    blob is no manifest (a layer: larger than a manifest may be, or not a JSON document of schemaVersion 2)."""
    try:
        if os.path.getsize(path) > MAX_MANIFEST:
            return None
        with open(path, "rb") as f:
            doc = json.loads(f.read(MAX_MANIFEST).decode("utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("schemaVersion") != 2:
        return None
    mt = doc.get("mediaType")
    return mt if isinstance(mt, str) and len(mt) < 128 else OCI_MANIFEST


class Server(ThreadingMixIn, HTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    root = ""  # the unpacked bundle
    refs = {}  # type: dict  # load_refs(root)
    slots = threading.BoundedSemaphore(MAX_CONNECTIONS)

    def server_bind(self):
        # HTTPServer.server_bind asks reverse DNS for the address (socket.getfqdn): an isolated site's resolver may
        # not answer for long; the name is never used
        TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), int(self.server_address[1])

    def process_request(self, request, client_address):
        self.slots.acquire()  # at most MAX_CONNECTIONS at once: the accept loop waits for a free one
        try:
            super().process_request(request, client_address)
        except Exception:
            self.slots.release()
            raise

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()

    def handle_error(self, request, client_address):
        pass  # a client gone mid-download: nothing to say, and nobody reads this process's stderr


class Server6(Server):
    address_family = socket.AF_INET6


def _until_stdin_ends():
    try:
        while sys.stdin.buffer.read(4096):
            pass
    finally:
        os._exit(0)


def _while_there(path):
    try:
        while os.path.exists(path):
            time.sleep(1)
    finally:
        os._exit(0)


def main(argv):
    if len(argv) not in (4, 6) or (len(argv) == 6 and argv[4] != "--while"):
        sys.stderr.write("usage: bundle_serve.py ROOT ADDRESS PORT [--while FILE]\n")
        return 2
    root, address, port = os.path.realpath(argv[1]), argv[2], int(argv[3])
    try:
        server = (Server6 if ":" in address else Server)((address, port), Handler)
    except OSError as e:
        sys.stderr.write(f"gpuk8s bundle server: cannot listen on {address}:{port}: {e.strerror}\n")
        return 1
    server.root = root
    server.refs = load_refs(root)
    if len(argv) == 6:
        threading.Thread(target=_while_there, args=(argv[5],), daemon=True).start()
    else:
        threading.Thread(target=_until_stdin_ends, daemon=True).start()
    sys.stdout.write(READY + "\n")
    sys.stdout.flush()
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

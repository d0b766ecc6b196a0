"""Builds the two images the CRI tests run, as one OCI image-layout tarball for `ctr images import`.

Both are one layer of Debian's static busybox (the binary and its applet links), no registry:
- ``localhost/gpuwarden/pause:cri``: the sandbox image; it sleeps, as kubernetes' pause does.
- ``localhost/gpuwarden/busybox:cri``: the test containers' image; the tests give the command.

    python3 tools/cri/images.py BUSYBOX OUT.tar

Deterministic (mtime 0, root-owned), so the digests stay the same from run to run.
"""

from __future__ import annotations

import hashlib
import io
import json
import sys
import tarfile

PAUSE = "localhost/gpuwarden/pause:cri"
BUSYBOX = "localhost/gpuwarden/busybox:cri"
APPLETS = ("sh", "sleep", "cat", "ls", "head", "true", "stat", "echo", "test", "grep")


def _layer(busybox: bytes) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for d in ("bin", "dev", "proc", "sys", "etc", "tmp"):
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if d == "tmp" else 0o755
            tar.addfile(info)
        info = tarfile.TarInfo("bin/busybox")
        info.size, info.mode = len(busybox), 0o755
        tar.addfile(info, io.BytesIO(busybox))
        for name in APPLETS:
            info = tarfile.TarInfo(f"bin/{name}")
            info.type, info.linkname = tarfile.SYMTYPE, "busybox"
            tar.addfile(info)
    return buf.getvalue()


def build(busybox: bytes) -> bytes:
    blobs: dict[str, bytes] = {}

    def blob(data: bytes) -> dict:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        blobs[digest] = data
        return {"digest": digest, "size": len(data)}

    layer = _layer(busybox)
    layer_desc = {"mediaType": "application/vnd.oci.image.layer.v1.tar", **blob(layer)}
    manifests = []
    for ref, cmd in ((PAUSE, ["/bin/sleep", "2147483647"]), (BUSYBOX, ["/bin/sh"])):
        config = {"architecture": "amd64", "os": "linux",
                  "config": {"Cmd": cmd, "Env": ["PATH=/bin"], "WorkingDir": "/"},
                  "rootfs": {"type": "layers", "diff_ids": [layer_desc["digest"]]}}
        cfg = blob(json.dumps(config, sort_keys=True).encode())
        manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **cfg},
                    "layers": [layer_desc]}
        m = blob(json.dumps(manifest, sort_keys=True).encode())
        manifests.append({"mediaType": "application/vnd.oci.image.manifest.v1+json", **m,
                          "platform": {"architecture": "amd64", "os": "linux"},
                          "annotations": {"io.containerd.image.name": ref,
                                          "org.opencontainers.image.ref.name": ref.rsplit(":", 1)[1]}})
    index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": manifests}
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        files = {"oci-layout": json.dumps({"imageLayoutVersion": "1.0.0"}).encode(),
                 "index.json": json.dumps(index, sort_keys=True).encode()}
        files.update({f"blobs/sha256/{d.split(':', 1)[1]}": b for d, b in sorted(blobs.items())})
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def main() -> int:
    src, dest = sys.argv[1], sys.argv[2]
    with open(src, "rb") as fh:
        data = build(fh.read())
    with open(dest + ".part", "wb") as fh:
        fh.write(data)
    import os

    os.replace(dest + ".part", dest)
    print(f"{dest}: {PAUSE}, {BUSYBOX} ({len(data)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

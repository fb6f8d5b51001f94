"""configMap and secret volumes as the harness's kubelet projects them: the object's keys (or
its items' paths) as files in a folder of the pod's, written again when the object changes (the
kubelet syncs them every minute or so; the runtime every 2 s). A Secret's token, say, is
filled in by the token controller after the pod is made."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any


def project(core: Any, namespace: str, volume: Any, root: Path) -> Path:
    """Write the volume's files under root/NAME, those that changed; return that folder."""
    folder = root / volume.name
    if volume.secret is not None:
        read = core.read_namespaced_secret(volume.secret.secret_name, namespace)
        data = {k: base64.b64decode(v) for k, v in (read.data or {}).items()}
        items = volume.secret.items
    else:
        read = core.read_namespaced_config_map(volume.config_map.name, namespace)
        data = {k: v.encode() for k, v in (read.data or {}).items()}
        items = volume.config_map.items
    folder.mkdir(parents=True, exist_ok=True)
    for key, path in [(i.key, i.path) for i in items or []] or [(k, k) for k in data]:
        file = folder / path
        if key in data and (not file.exists() or file.read_bytes() != data[key]):
            file.parent.mkdir(parents=True, exist_ok=True)
            fresh = file.with_name(f".{file.name}.new")
            fresh.write_bytes(data[key])
            fresh.replace(file)
    return folder

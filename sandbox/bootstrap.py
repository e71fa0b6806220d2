"""Base images from Debian's mirror, for hosts that reach no container registry.

``prefect-harbor images bootstrap debian:bookworm`` runs ``debootstrap --variant=minbase``
against the host's own Debian mirror and imports the tree with ``podman import`` as
``prefect-harbor.local/library/debian:bookworm``, where :mod:`.images` finds it when the
real ``debian:bookworm`` cannot be pulled. A ``-slim`` reference gets the same minbase tree
(tagged, not bootstrapped twice): the official slim images are minbase trees too.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from prefect_harbor.sandbox.engine import EngineError, engine_env, podman_path, podman_sync
from prefect_harbor.sandbox.images import bootstrapped_name

DEFAULT_MIRROR = "http://deb.debian.org/debian"
_REFERENCE = re.compile(r"^(?:docker\.io/)?(?:library/)?debian:(?P<suite>[a-z]+)(?P<slim>-slim)?$")


def host_debian_mirror() -> str:
    """The first Debian archive in the host's apt sources (the mirror this host can reach)."""
    sources = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for source in sources:
        try:
            text = source.read_text()
        except OSError:
            continue
        for url in re.findall(r"(?:^deb\s+(?:\[[^\]]*\]\s+)?|^URIs:\s*)(\S+)", text, re.MULTILINE):
            if url.rstrip("/").endswith("/debian"):
                return url.rstrip("/")
    return DEFAULT_MIRROR


def bootstrap(reference: str, mirror: str | None = None, *, force: bool = False) -> str:
    """Make ``reference`` (``debian:<suite>[-slim]``) available locally; the local image's name."""
    match = _REFERENCE.match(reference)
    if not match:
        raise ValueError(f"{reference!r}: only debian:<suite> and debian:<suite>-slim can be bootstrapped from Debian's mirror.")
    target = bootstrapped_name(reference)
    if not force and podman_sync("image", "exists", target).returncode == 0:
        return target
    sibling = bootstrapped_name(f"debian:{match['suite']}" + ("" if match["slim"] else "-slim"))
    if not force and podman_sync("image", "exists", sibling).returncode == 0:
        podman_sync("tag", sibling, target).check(f"tagging {sibling} as {target}")
        return target
    if shutil.which("debootstrap") is None:
        raise EngineError("debootstrap is not installed (apt-get install debootstrap).")
    with tempfile.TemporaryDirectory(prefix="prefect-harbor-bootstrap-") as scratch:
        root = Path(scratch, "rootfs")
        run = subprocess.run(
            ["debootstrap", "--variant=minbase", match["suite"], str(root), mirror or host_debian_mirror()],
            capture_output=True, text=True,
        )  # fmt: skip
        if run.returncode != 0:
            raise EngineError(f"debootstrap {match['suite']} failed: {(run.stderr or run.stdout)[-2000:]}")
        for cache in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for entry in (root / cache).glob("*"):
                if entry.is_file():
                    entry.unlink()
        tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
        imported = subprocess.run(
            [podman_path(), "import", "--change", 'CMD ["bash"]', "--message", f"debootstrap --variant=minbase {match['suite']}", "-", target],
            stdin=tar.stdout, capture_output=True, env=engine_env(),
        )  # fmt: skip
        tar.wait()
        if imported.returncode != 0:
            raise EngineError(f"podman import failed: {imported.stderr.decode(errors='replace')[-2000:]}")
    return target


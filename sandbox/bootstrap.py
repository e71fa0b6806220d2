"""Base images from Debian's mirror, for hosts that reach no container registry.

``prefect-harbor images bootstrap debian:bookworm`` runs ``debootstrap --variant=minbase``
against the host's own Debian mirror and imports the tree with ``podman import`` as
``prefect-harbor.local/library/debian:bookworm``, where :mod:`.images` finds it when the
real ``debian:bookworm`` cannot be pulled. A ``-slim`` reference gets the same minbase tree
(tagged, not bootstrapped twice): the official slim images are minbase trees too. So does a
release number (``debian:13.0-slim`` is trixie's tree): the mirror serves each suite's current
point release, not an older one. :mod:`.images` bootstraps a ``debian:*`` base on first use.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from prefect_harbor.sandbox.engine import EngineError, podman_sync
from prefect_harbor.sandbox.images import bootstrapped_name

DEFAULT_MIRROR = "http://deb.debian.org/debian"
_REFERENCE = re.compile(r"^(?:docker\.io/)?(?:library/)?debian:(?P<suite>[a-z]+|\d+(?:\.\d+)*)(?P<slim>-slim)?$")
#: Debian's release numbers and their suites, for ``debian:13.0-slim``-style tags.
RELEASES = {"10": "buster", "11": "bullseye", "12": "bookworm", "13": "trixie", "14": "forky"}


def debian_suite(reference: str) -> str | None:
    """The Debian suite a ``debian:<suite>[-slim]`` or ``debian:<version>[-slim]`` reference names, else None."""
    match = _REFERENCE.match(reference)
    if not match:
        return None
    suite = match["suite"]
    if suite[0].isdigit():
        return RELEASES.get(suite.split(".")[0])
    return "stable" if suite == "latest" else suite


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
    """Make ``reference`` (``debian:<suite>[-slim]`` or ``debian:<version>[-slim]``) available locally; the local image's name."""
    suite = debian_suite(reference)
    if suite is None:
        raise ValueError(
            f"{reference!r}: only debian:<suite>[-slim] and debian:<version>[-slim] ({', '.join(sorted(RELEASES))}) can be bootstrapped from Debian's mirror."
        )
    target = bootstrapped_name(reference)
    if not force and podman_sync("image", "exists", target).returncode == 0:
        return target
    # One tree serves every tag of a suite, kept under the suite's own slim name (tags of it can come and go).
    tree = bootstrapped_name(f"debian:{suite}-slim")
    for sibling in (tree, bootstrapped_name(f"debian:{suite}")):
        if not force and podman_sync("image", "exists", sibling).returncode == 0:
            podman_sync("tag", sibling, target).check(f"tagging {sibling} as {target}")
            return target
    debootstrap_image(suite, tree, mirror)
    if target != tree:
        podman_sync("tag", tree, target).check(f"tagging {tree} as {target}")
    return target


def debootstrap_image(suite: str, target: str, mirror: str | None, include: tuple[str, ...] = ()) -> None:
    """``debootstrap --variant=minbase SUITE`` (with the packages ``include`` names) imported as the image ``target``."""
    if shutil.which("debootstrap") is None:
        raise EngineError("debootstrap is not installed (apt-get install debootstrap).")
    with tempfile.TemporaryDirectory(prefix="prefect-harbor-bootstrap-") as scratch:
        root = Path(scratch, "rootfs")
        run = subprocess.run(
            ["debootstrap", "--variant=minbase", *([f"--include={','.join(include)}"] if include else []), suite, str(root), mirror or host_debian_mirror()],
            capture_output=True, text=True,
        )  # fmt: skip
        if run.returncode != 0:
            raise EngineError(f"debootstrap {suite} failed: {(run.stderr or run.stdout)[-2000:]}")
        for cache in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for entry in (root / cache).glob("*"):
                if entry.is_file():
                    entry.unlink()
        tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
        assert tar.stdout is not None  # stdout=PIPE
        with tar.stdout:  # closed after, ours too: a podman that stopped reading must not leave tar blocked for ever
            imported = podman_sync(
                "import", "--change", 'CMD ["bash"]', "--message", f"debootstrap --variant=minbase {suite} {' '.join(include)}".strip(), "-", target,
                stdin=tar.stdout, timeout=None,
            )
        tar.wait()
        if imported.returncode != 0:
            raise EngineError(f"podman import failed: {imported.stderr.decode(errors='replace')[-2000:]}")


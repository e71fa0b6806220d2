"""The seccomp profile of every container this project starts, trials and image builds alike.

It is the engine's own default profile (``/usr/share/containers/seccomp.json``) made as strict
as Docker's default on two points where podman's is looser, because a container's root here is
the host's root (no user namespace):

* the kernel keyrings (``keyctl``, ``add_key``, ``request_key``) are denied: they are shared
  with the host's root, so a trial or a ``RUN`` step could read or revoke the host's keys;
* new namespaces need ``CAP_SYS_ADMIN``, which no container here has: ``unshare``, ``setns``,
  ``mount``, ``umount2``, ``pivot_root`` and the new mount API answer EPERM, ``clone`` is
  allowed only without namespace flags, and ``clone3`` answers ENOSYS so that libc falls back
  to ``clone``. Podman's profile lets ``unshare -Ur`` make a user namespace in which the
  process holds every capability, and mount file systems: a wider kernel surface than Docker
  gives a task.

The profile is written once per content into a folder only this user can write, and its
content is checked against its digest before each use: a profile that something else rewrote
is written again, never handed to the engine.
"""

from __future__ import annotations

import hashlib
import json
import os
from functools import cache
from pathlib import Path

from prefect_harbor.sandbox.private import private_folder

#: The engine's default profile, which every container gets less what this module takes away.
DEFAULT_SECCOMP_PROFILE = Path("/usr/share/containers/seccomp.json")
#: Shared with the host's root without a user namespace (Docker's default denies them too).
DENIED_SYSCALLS = frozenset({"keyctl", "add_key", "request_key"})
#: What Docker's default profile allows only with CAP_SYS_ADMIN: namespaces and mounts.
NEEDS_SYS_ADMIN = frozenset({
    "unshare", "setns", "mount", "umount", "umount2", "pivot_root", "name_to_handle_at",
    "fsconfig", "fsmount", "fsopen", "fspick", "mount_setattr", "move_mount", "open_tree",
})  # fmt: skip
#: CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET: Docker's mask for ``clone``.
CLONE_NAMESPACE_FLAGS = 0x7E020000
_EPERM, _ENOSYS = 1, 38


def strict_profile(default: dict) -> dict:
    """``default`` (the engine's profile, as JSON) with the keyring and namespace rules above."""
    profile = json.loads(json.dumps(default))
    taken = DENIED_SYSCALLS | NEEDS_SYS_ADMIN | {"clone", "clone3"}
    rules = []
    for rule in profile.get("syscalls", []):
        unconditional = not rule.get("args") and not (rule.get("includes") or {}).get("caps") and rule.get("action") == "SCMP_ACT_ALLOW"
        names = [name for name in rule.get("names", []) if name not in DENIED_SYSCALLS and not (unconditional and name in taken)]
        if names:
            rules.append({**rule, "names": names})
    sys_admin = {"caps": ["CAP_SYS_ADMIN"]}
    rules += [
        {"names": sorted(NEEDS_SYS_ADMIN | {"clone", "clone3"}), "action": "SCMP_ACT_ALLOW", "includes": sys_admin},
        {"names": sorted(NEEDS_SYS_ADMIN), "action": "SCMP_ACT_ERRNO", "errnoRet": _EPERM, "excludes": sys_admin},
        {
            "names": ["clone"], "action": "SCMP_ACT_ALLOW", "excludes": {**sys_admin, "arches": ["s390", "s390x"]},
            "args": [{"index": 0, "value": CLONE_NAMESPACE_FLAGS, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}],
        },
        {
            "names": ["clone"], "action": "SCMP_ACT_ALLOW", "includes": {"arches": ["s390", "s390x"]}, "excludes": sys_admin,
            "args": [{"index": 1, "value": CLONE_NAMESPACE_FLAGS, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}],
        },
        # glibc tries clone3 first and falls back to clone on ENOSYS (clone3's flags are in memory, out of a filter's reach).
        {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": _ENOSYS, "excludes": sys_admin},
    ]  # fmt: skip
    # A rule that says what the default says is dropped (clone3's ENOSYS, where the default is ENOSYS too):
    # libseccomp refuses such a filter in the builder's buildah ("requested action matches default action").
    said_by_default = (profile.get("defaultAction"), profile.get("defaultErrnoRet"))
    profile["syscalls"] = [rule for rule in rules if (rule["action"], rule.get("errnoRet")) != said_by_default]
    return profile


def profile_folder() -> Path:
    """A folder only this user can write: where the profile is kept.

    Not the system's temporary folder: anyone can create a name there first, and a profile
    another user could rewrite would let them choose what a container may call."""
    return private_folder(Path(os.environ.get("XDG_RUNTIME_DIR") or Path.home() / ".cache") / "prefect-harbor" / "seccomp", "the seccomp profile")


@cache
def _profile_text() -> str | None:
    try:
        default = json.loads(DEFAULT_SECCOMP_PROFILE.read_text())
    except (OSError, ValueError):
        return None
    return json.dumps(strict_profile(default), sort_keys=True)


def seccomp_profile() -> Path | None:
    """The profile's path, its content checked against its digest; None without an engine default."""
    text = _profile_text()
    if text is None:
        return None
    digest = hashlib.sha256(text.encode()).hexdigest()
    path = profile_folder() / f"seccomp-{digest[:16]}.json"
    try:
        intact = hashlib.sha256(path.read_bytes()).hexdigest() == digest
    except OSError:
        intact = False
    if not intact:
        staging = path.with_suffix(f".{os.getpid()}.tmp")
        staging.write_text(text)
        staging.replace(path)
    return path


def seccomp_options() -> list[str]:
    """The engine options that apply the profile (``podman run`` and ``podman build`` alike)."""
    profile = seccomp_profile()
    return ["--security-opt", f"seccomp={profile}"] if profile else []

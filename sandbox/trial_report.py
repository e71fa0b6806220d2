"""What the sandbox saw of a trial that Harbor's own files do not say.

Each environment of a trial (the agent's, a separate verifier's) keeps a JSON file in the
trial's folder, ``sandbox/<environment>.json``, beside Harbor's ``result.json`` and outside the
folders copied from the container (``agent/``, ``verifier/``, ``artifacts/``), so nothing inside
a container can write it. Sections, each a list of entries:

* ``copies_cut``: a copy out of the container that stopped at ``max_copy_mb``, with how many
  files and bytes it kept and dropped;
* ``verifications``: the evidence around each verifier run (:mod:`.verifier_watch`);
* ``network``: each destination a restricted trial asked its proxy for, allowed or refused
  (:mod:`.egress`), or a public trial connected to (:mod:`.connections`); present and empty
  when there was none.

The row reads them back (:func:`read_sections`): ``verifier_tampering`` and ``hosts_tried``
come from here, and the archive keeps the folder.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

FOLDER = "sandbox"


class TrialReport:
    """One environment's report file (see the module docstring)."""

    def __init__(self, trial_dir: Path, environment: str):
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in environment)[:120] or "environment"
        self.path = trial_dir / FOLDER / f"{safe}.json"
        self._sections: dict[str, list[dict[str, Any]]] = {}
        self._keys: dict[tuple[str, str], int] = {}

    def add(self, section: str, entry: dict[str, Any]) -> None:
        """Append ``entry`` to ``section`` and write the file whole (a crash leaves the last one)."""
        self._sections.setdefault(section, []).append(entry)
        self.write()

    def open(self, section: str) -> None:
        """Make ``section`` present, empty: what is watched and saw nothing says so."""
        if section not in self._sections:
            self._sections[section] = []
            self.write()

    def put(self, section: str, entry: dict[str, Any], *, key: str) -> None:
        """``entry`` in ``section``, in place of the one put before with the same ``key``."""
        self.put_all(section, {key: entry})

    def put_all(self, section: str, entries: dict[str, dict[str, Any]]) -> None:
        """:meth:`put` for each ``key: entry`` of ``entries``, and the file written once."""
        for key, entry in entries.items():
            section_entries = self._sections.setdefault(section, [])
            position = self._keys.setdefault((section, key), len(section_entries))
            section_entries[position:position + 1] = [entry]
        self.write()

    def write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=self.path.parent, prefix=".report-")
        with os.fdopen(handle, "w") as out:
            json.dump(self._sections, out, indent=2, default=str)
        os.replace(temporary, self.path)


def read_sections(trial_dir: Path, section: str) -> list[dict[str, Any]] | None:
    """Every environment's entries of ``section`` in the trial at ``trial_dir``; None when no
    environment wrote that section (another environment type, or nothing of the kind happened)."""
    entries: list[dict[str, Any]] | None = None
    for path in sorted((trial_dir / FOLDER).glob("*.json")):
        try:
            sections = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(sections, dict) and isinstance(sections.get(section), list):
            entries = [*(entries or []), *sections[section]]
    return entries

#!/bin/bash
# Runs with no network (the verifier's network_mode): the wheel must be there already.
python3 - <<'PY'
import pathlib, subprocess, zipfile
wheels = list(pathlib.Path("/app/wheels").glob("six-1.16.0-*.whl"))
ok = len(wheels) == 1 and "six.py" in zipfile.ZipFile(wheels[0]).namelist()
# The other host was refused by the allowlist: curl failed.
ok = ok and pathlib.Path("/app/other-host-exit.txt").read_text().strip() not in ("", "0")
# And the verifier's own phase has no network, the allowlist's hosts included.
probe = subprocess.run(["curl", "--silent", "--max-time", "20", "--output", "/dev/null", "https://pypi.org/simple/six/"])
ok = ok and probe.returncode != 0
print("wheels:", wheels, "curl from the verifier:", probe.returncode)
pathlib.Path("/logs/verifier/reward.txt").write_text("1" if ok else "0")
PY

#!/bin/bash
# Verifier (runs as root, cwd = workdir /app). Installs jq now, at verify time, the way
# many public tasks install curl or uv: the image does not have it. Writes reward.txt:
# 1 when release.json has exactly the two keys with the right values, else 0.
set -u
mkdir -p /logs/verifier
if ! command -v jq >/dev/null; then
  apt-get update -qq >/dev/null && apt-get install -y -qq --no-install-recommends jq >/dev/null
fi
if jq -e '(keys == ["name", "version"]) and .name == "prefect-harbor" and .version == 1' release.json >/dev/null 2>&1; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
cat /logs/verifier/reward.txt

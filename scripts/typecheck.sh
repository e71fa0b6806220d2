#!/usr/bin/env bash
# mypy on the core and the sandbox, as the one package `prefect_harbor` they install as.
#
# setuptools maps the spine folders (sandbox/, flows/, ...) into prefect_harbor (pyproject.toml,
# package-dir). mypy cannot follow that mapping, so it is given the same tree as links: every
# import between the core and the spine is then checked, as it resolves once installed.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
tree=$(mktemp -d)
trap 'rm -rf "$tree"' EXIT
mkdir "$tree/prefect_harbor"
for entry in prefect_harbor/*; do ln -s "$root/$entry" "$tree/prefect_harbor/"; done
for spine in sandbox flows tasks blocks deployments; do ln -s "$root/$spine" "$tree/prefect_harbor/$spine"; done
# The cache lives outside the checkout, so a fresh clone (CI's) starts warm: ~40 s -> ~3 s. It is
# safe to share: mypy trusts an entry only while its file's hash matches.
cache="${XDG_CACHE_HOME:-$HOME/.cache}/prefect-harbor/mypy"
mkdir -p "$cache"
cd "$tree"
MYPYPATH="$tree" exec "$root/.venv/bin/mypy" --config-file "$root/pyproject.toml" --cache-dir "$cache" \
    --python-executable "$root/.venv/bin/python" \
    -p prefect_harbor.sandbox -p prefect_harbor.trial -p prefect_harbor.rows -p prefect_harbor.storage \
    -p prefect_harbor.agents -p prefect_harbor.config -p prefect_harbor.spec -p prefect_harbor.secrets -p prefect_harbor.outcome "$@"

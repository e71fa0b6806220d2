#!/usr/bin/env bash
# One entry point for a fresh machine: set everything up, then run the demo sweep or the tests.
#   bash scripts/dev.sh demo   # set up, then sweep the bundled example tasks
#   bash scripts/dev.sh test   # set up, then run the whole test suite (what CI runs)
#   bash scripts/dev.sh setup  # set up only
set -euo pipefail
cd "$(dirname "$0")/.."

# Python keeps what it compiles (__pycache__, ignored by git and by bundles): where the machine's
# image sets PYTHONDONTWRITEBYTECODE, every process would compile every module it imports again
# (3 s more per CLI start, minutes over the test suite's hundreds of processes).
unset PYTHONDONTWRITEBYTECODE

say() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }

# System tools: the daemonless container engine (podman, buildah, runc; tini as the
# containers' init; catatonit, from which podman builds the pause image of a multi-service
# task's pod; debootstrap for base images from Debian's mirror), git (git task sources)
# and, for the test suite's UI checks, chromium.
ensure_system_packages() {
    local missing=()
    command -v podman >/dev/null || missing+=(podman)
    command -v buildah >/dev/null || missing+=(buildah)
    command -v runc >/dev/null || missing+=(runc)
    [ -x /usr/bin/tini-static ] || missing+=(tini)
    command -v catatonit >/dev/null || missing+=(catatonit)
    command -v debootstrap >/dev/null || missing+=(debootstrap)
    command -v iptables >/dev/null || missing+=(iptables)
    command -v git >/dev/null || missing+=(git)
    if [ "${1:-}" = test ]; then command -v chromium >/dev/null || missing+=(chromium); fi
    [ ${#missing[@]} -eq 0 ] && return
    if [ "$(id -u)" -ne 0 ]; then
        echo "error: missing system packages: ${missing[*]}; install them (e.g. sudo apt-get install ${missing[*]}) and re-run." >&2
        exit 1
    fi
    say "Installing system packages: ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# Subordinate ids for podman's --userns=auto (the sandbox's opt-in `userns: auto`, and its test):
# a range for the `containers` user, as podman's documentation gives it. Root only; idempotent.
ensure_subordinate_ids() {
    [ "$(id -u)" -eq 0 ] || return 0
    local table
    for table in /etc/subuid /etc/subgid; do
        grep -q '^containers:' "$table" 2>/dev/null || echo "containers:2147483647:2147483648" >> "$table"
    done
}

# The first Python >= 3.12 we can find: on PATH, then pyenv's versions.
find_python() {
    local candidate
    for candidate in python3.12 python3.13 python3 "$HOME"/.pyenv/versions/3.1[2-9]*/bin/python3; do
        if "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
            command -v "$candidate" 2>/dev/null || echo "$candidate"
            return
        fi
    done
    echo "error: Python >= 3.12 not found; install it (e.g. apt-get install python3.12 or pyenv install 3.12)." >&2
    exit 1
}

setup() {
    ensure_system_packages "${1:-}"
    ensure_subordinate_ids
    PYTHON=$(find_python)
    # `uv --version`, not `command -v uv`: a pyenv shim exists for every version's tools and
    # fails when the selected version has none.
    if uv --version >/dev/null 2>&1; then
        UV=(uv)
    else
        "$PYTHON" -m uv --version >/dev/null 2>&1 || { say "Installing uv"; "$PYTHON" -m pip install --quiet uv; }
        UV=("$PYTHON" -m uv)
    fi
    say "Syncing the locked environment (.venv)"
    # No --compile-bytecode: compiling all of site-packages took 55 s (100 s of CPU) on a 2-core
    # machine, and a run imports about a tenth of it. Each module is compiled the first time a
    # process imports it, and kept (PYTHONDONTWRITEBYTECODE is unset above).
    UV_PYTHON_DOWNLOADS=never "${UV[@]}" sync --locked --python "$PYTHON" --quiet
    # The examples' and tests' FROM lines; where a registry is reachable podman pulls the
    # real images instead. Kept in podman's storage: later runs find them (~45 s the first time).
    say "Base images (prefect-harbor images bootstrap)"
    .venv/bin/prefect-harbor images bootstrap debian:bookworm-slim debian:bookworm
    # Task images are built inside a builder container (Debian 13's buildah), never by the host's own.
    say "Image builder (prefect-harbor images builder)"
    .venv/bin/prefect-harbor images builder
    # Disk stays bounded: task images no sweep used lately, and the builder's cache over its cap
    # (PREFECT_HARBOR_BUILDER_CACHE_GB). The suite makes ~45 one-off images a run, and every podman
    # call reads the whole image store (27 ms of CPU at 90 images, 67 ms at 700): its setup keeps
    # only the images a sweep used in the last 3 hours (a run uses ~90; older ones are built again).
    say "Disk (prefect-harbor images prune)"
    .venv/bin/prefect-harbor images prune --unused-days "$([ "${1:-}" = test ] && echo 0.125 || echo 14)"
}

# Offline-friendly Prefect defaults: no analytics, and time for a cold ephemeral server.
export PREFECT_SERVER_ANALYTICS_ENABLED="${PREFECT_SERVER_ANALYTICS_ENABLED:-false}"
export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="${PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS:-120}"

# The linters CI runs before the tests: ruff (pyproject.toml [tool.ruff]) and mypy on the core and sandbox.
lint() {
    say "Lint (ruff) and types (mypy)"
    .venv/bin/ruff check .
    bash scripts/typecheck.sh
}

case "${1:-}" in
    setup)
        setup ;;
    demo)
        setup
        say "Sweeping the bundled example tasks (examples/dataset.jsonl)"
        exec .venv/bin/prefect-harbor sweep --tasks-dir examples/tasks --dataset examples/dataset.jsonl --results results ;;
    lint)
        setup
        lint ;;
    test)
        setup test
        shift
        report=$(mktemp -d -t prefect-harbor-suite-XXXXXX)
        timed() { local name=$1 started=$SECONDS status=0; shift; "$@" || status=$?; echo "$name $((SECONDS - started))" >> "$report/walls"; return $status; }
        timed lint lint
        # Two processes (pytest-xdist): much of a test is waiting (podman, servers, sleeps), so two
        # cores overlap it. tests/conftest.py keeps a module, and the UI-server tests, in one process.
        # The fast tier first: a broken unit stops the run before the slow tiers start. It is unit
        # tests only: a podman, buildah and debootstrap that refuse are first on its PATH, and the
        # suite's server fixtures refuse it (tests/tiers.py).
        say "Fast tier (unit tests: no container, no server)"
        # (Exit status 5 is "no test selected": arguments that name only tests of the other tier.)
        COVERAGE_FILE="$report/.coverage" PREFECT_HARBOR_TEST_TIER=unit PATH="$PWD/tests/unit_tier:$PATH" \
            PREFECT_SERVER_ALLOW_EPHEMERAL_MODE=false timed "fast tier" \
            .venv/bin/python -m pytest -n 2 -m "not integration and not slow" -x --junitxml="$report/fast.xml" \
            --cov=prefect_harbor --cov-report= "$@" || [ $? -eq 5 ]
        say "Integration and slow tiers (real trials, servers, S3, browser)"
        status=0
        timed "integration and slow tiers" .venv/bin/python -m pytest -n 2 -m "integration or slow" \
            --junitxml="$report/integration.xml" "$@" || status=$?
        [ $status -eq 5 ] && status=0
        .venv/bin/python scripts/suite_report.py "$report" || true
        exit $status ;;
    *)
        echo "usage: bash scripts/dev.sh {demo|test|setup|lint}" >&2
        exit 2 ;;
esac

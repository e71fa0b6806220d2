"""A task's docker-compose.yaml: main merged into the container's settings, other services read
as Harbor's docker environment runs them, or refused naming the key."""

import pytest

from prefect_harbor.sandbox.compose import ComposeNotSupported, Healthcheck, load
from prefect_harbor.sandbox.pod import hosts_file

#: What `harbor tasks migrate` writes for a Terminal-Bench task with non-default compose settings.
MIGRATED = """services:
  main:
    build:
      context: ${CONTEXT_DIR}
    image: ${MAIN_IMAGE_NAME}
    command: [sh, -c, sleep infinity]
    environment:
      - TEST_DIR=${TEST_DIR}
      - MODE=strict
    deploy:
      resources:
        limits: {cpus: "${CPUS}", memory: "${MEMORY}"}
    volumes:
      - ${HOST_VERIFIER_LOGS_PATH}:${ENV_VERIFIER_LOGS_PATH}
    working_dir: /srv
    extra_hosts: ["db.internal:127.0.0.1"]
    healthcheck:
      test: ["CMD-SHELL", "test -f /srv/ready"]
"""


def project(tmp_path, text: str):
    (tmp_path / "docker-compose.yaml").write_text(text)
    return load(tmp_path)


def compose(tmp_path, text: str):
    """The main service's settings."""
    return project(tmp_path, text).main


def test_a_migrated_main_service_becomes_container_settings(tmp_path):
    settings = compose(tmp_path, MIGRATED)
    assert settings.environment == {"TEST_DIR": "/tests", "MODE": "strict"}
    assert (settings.working_dir, settings.extra_hosts) == ("/srv", ["db.internal:127.0.0.1"])
    assert settings.healthcheck == Healthcheck(test=("/bin/sh", "-c", "test -f /srv/ready"))
    assert settings.image is None and settings.run_args() == []


def test_no_compose_file_is_no_project(tmp_path):
    assert load(tmp_path) is None


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("services:\n  main:\n    privileged: true\n", "services.main.privileged cannot be honoured"),
        ("services:\n  main:\n    volumes: ['data:/var/lib/data']\n", "services.main.volumes[0]: the named volume 'data' cannot be honoured"),
        ("services:\n  main:\n    volumes: [/var/cache]\n", "services.main.volumes[0]: an anonymous volume cannot be honoured"),
        ("services:\n  main:\n    volumes: ['/srv:/tests/data']\n", "services.main.volumes[0]: target '/tests/data' cannot be a mount here"),
        ("services:\n  main:\n    volumes: [{type: tmpfs, target: /logs/verifier}]\n", "target '/logs/verifier' cannot be a mount here"),
        # The tmpfs a host path becomes is given as TARGET:OPTIONS: a target cannot add options, nor reach /tests by '..'.
        ("services:\n  main:\n    volumes: [{type: tmpfs, target: '/data:rw,suid,dev'}]\n", "target '/data:rw,suid,dev' cannot be a mount here: a plain absolute path"),
        ("services:\n  main:\n    volumes: [{type: bind, source: /srv, target: '/data,suid'}]\n", "target '/data,suid' cannot be a mount here: a plain absolute path"),
        ("services:\n  main:\n    volumes: [{type: tmpfs, target: /srv/../tests}]\n", "target '/srv/../tests' cannot be a mount here: a plain absolute path"),
        ("services:\n  main:\n    command: python server.py\n", "services.main.command"),
        ("services:\n  main:\n    network_mode: host\n", "services.main.network_mode: 'host'"),
        ("services:\n  db: {environment: {A: b}}\n", "services.db: a service beside main needs a build or an image"),
        ("services:\n  db: {image: x, privileged: true}\n", "services.db.privileged cannot be honoured"),
        ("services:\n  db: {image: x, cap_add: [NET_ADMIN]}\n", "services.db.cap_add cannot be honoured"),
        ("services:\n  db: {image: x, volumes: [{type: volume, source: data, target: /data}]}\n", "services.db.volumes[0]: the named volume 'data'"),
        ("services:\n  db: {image: x, network_mode: host}\n", "services.db.network_mode cannot be honoured"),
        ("services:\n  db: {image: x, networks: [back]}\n", "services.db.networks: 'back' is not declared"),
        ("services:\n  db: {image: 'postgres:${TAG:?set the tag}'}\n", "services.db.image: ${TAG} must be set (set the tag); list TAG in the backend's task_env_passthrough"),
        ("services:\n  db: {image: 'postgres:${TAG'}\n", "services.db.image: 'postgres:${TAG' has a '${' without its closing '}'"),
        ("services:\n  db: {build: ../..}\n", "services.db.build.context: '../..' is outside the task's environment folder"),
        ("services:\n  db: {build: {context: ., args: {A: b}}}\n", "services.db.build.args cannot be honoured"),
        ("services:\n  db: {build: ./missing}\n", "does not exist"),
        ("services:\n  main: {depends_on: [db]}\n", "services.main.depends_on: 'db' is not a service"),
        ("services:\n  main: {depends_on: {db: {condition: service_healthy}}}\n  db: {image: x}\n", "'db' has no healthcheck"),
        ("services:\n  main: {depends_on: {db: {condition: sometimes}}}\n  db: {image: x}\n", "services.main.depends_on.db: only a condition of"),
        ("services:\n  a: {image: x, depends_on: [b]}\n  b: {image: x, depends_on: [a]}\n", "depends_on goes round in a circle"),
        ("services:\n  main: {network_mode: none}\n  db: {image: x}\n", "network_mode: 'none' would cut main off from its services"),
        ("services:\n  db: {image: x, healthcheck: {test: [CMD, 'true'], interval: soon}}\n", "healthcheck.interval: 'soon' is not a duration"),
        ("services:\n  db: {image: x}\nvolumes: {data: {}}\n", "top-level volumes"),
        ("services:\n  db: {image: x}\nsecrets: {s: {file: /etc/shadow}}\n", "top-level secrets"),
    ],
)
def test_what_the_sandbox_cannot_honour_is_refused_naming_the_key(tmp_path, text, named):
    with pytest.raises(ComposeNotSupported) as refused:
        project(tmp_path, text)
    assert named in str(refused.value)


def test_dollars_are_unescaped(tmp_path):
    settings = compose(tmp_path, 'services:\n  main:\n    entrypoint: ["/bin/sh", "-c", "exec \\"$$@\\" $${HOME}", "--"]\n')
    assert settings.entrypoint == ["/bin/sh", "-c", 'exec "$@" ${HOME}', "--"]


#: A compose file reading host variables in the forms compose knows.
VARIABLES = """services:
  main:
    environment:
      GH_TOKEN: ${GH_TOKEN}
      MISSING: ${NOT_PASSED}
      LEVEL: ${LOG_LEVEL:-info}
      EMPTY_OR: ${EMPTY_ONE:-fallback}
      UNSET_ONLY: ${EMPTY_ONE-kept-empty}
      HOME_DIR: ${HOME:-/root}
      BRACELESS: $GH_TOKEN/x
      NESTED: ${NOPE:-${GH_TOKEN}}
      ALT: ${GH_TOKEN:+present}
      PRICE: cost $$5
      TESTS: ${TEST_DIR}/data
  api:
    image: "registry.local/api:${API_TAG:-1.0}"
"""


def test_variables_come_from_task_env_passthrough_only_and_compose_rules_fill_the_rest(tmp_path, monkeypatch):
    from prefect_harbor.sandbox.interpolation import ComposeVariables

    monkeypatch.setenv("GH_TOKEN", "ghp_passed_through_value")
    monkeypatch.setenv("EMPTY_ONE", "")
    monkeypatch.setenv("HOME", "/home/the-sweeps-owner")
    monkeypatch.setenv("NOT_PASSED", "host-secret-not-listed")
    (tmp_path / "docker-compose.yaml").write_text(VARIABLES)
    read = load(tmp_path, variables=ComposeVariables.from_host(["GH_TOKEN", "EMPTY_ONE", "API_TAG"]))
    assert read.main.environment == {
        "GH_TOKEN": "ghp_passed_through_value", "MISSING": "", "LEVEL": "info", "EMPTY_OR": "fallback", "UNSET_ONLY": "",
        "HOME_DIR": "/root", "BRACELESS": "ghp_passed_through_value/x", "NESTED": "ghp_passed_through_value", "ALT": "present",
        "PRICE": "cost $5", "TESTS": "/tests/data",
    }  # fmt: skip
    assert read.services["api"].image == "registry.local/api:1.0"
    warnings = "\n".join(read.warnings)
    assert "services.main.environment.MISSING: ${NOT_PASSED} is unset: the host sets NOT_PASSED, but the backend's task_env_passthrough does not list it" in warnings
    assert "${HOME} is unset: the host sets HOME" in warnings, "a withheld variable is warned about even with a default"
    assert "LOG_LEVEL" not in warnings and "API_TAG" not in warnings, "an unset variable with a default is not warned about, as in compose"
    assert "host-secret-not-listed" not in warnings and "the-sweeps-owner" not in warnings, "a warning told a host value"


def test_without_passthrough_no_host_variable_is_read(tmp_path, monkeypatch):
    monkeypatch.setenv("GH_TOKEN", "ghp_never_read")
    read = project(tmp_path, VARIABLES)
    assert read.main.environment["GH_TOKEN"] == "" and read.main.environment["BRACELESS"] == "/x"
    assert any("${GH_TOKEN} is unset" in warning for warning in read.warnings)


def test_harbors_placeholders_keep_their_meaning(tmp_path, monkeypatch):
    monkeypatch.setenv("CPUS", "99")
    settings = compose(tmp_path, MIGRATED)  # ${CONTEXT_DIR}, ${MAIN_IMAGE_NAME}, ${CPUS}, ${MEMORY}, the log volumes
    assert settings.image is None and settings.environment["TEST_DIR"] == "/tests"


def test_a_service_on_mains_image_is_built_as_main_is(tmp_path):
    (tmp_path / "Dockerfile").write_text("FROM debian:bookworm-slim\n")
    worker = project(tmp_path, "services:\n  main: {}\n  worker: {image: '${MAIN_IMAGE_NAME}', command: [sleep, infinity]}\n").services["worker"]
    assert (worker.image, worker.build.context, worker.build.dockerfile) == (None, tmp_path.resolve(), (tmp_path / "Dockerfile").resolve())


def test_extension_fields_are_ignored_as_compose_ignores_them(tmp_path):
    read = project(tmp_path, "x-common: &common {environment: {MODE: strict}}\nservices:\n  main:\n    <<: *common\n    x-note: ignored\n")
    assert read.main.environment == {"MODE": "strict"}


@pytest.mark.parametrize(
    "text",
    [
        "services:\n  main: {networks: [backend]}\n  db: {image: x, networks: {backend: {aliases: [database]}}}\nnetworks:\n  backend: {driver: bridge}\n",
        "services:\n  main: {}\n  db: {image: x, networks: {default: {aliases: [database]}}}\nnetworks:\n  default: {name: shared, labels: {a: b}}\n",
        "services:\n  main: {networks: [front, back]}\n  db: {image: x, networks: [back, front], }\nnetworks: {front: {}, back: {driver: bridge, internal: false}}\n",
    ],
    ids=["one-named-bridge", "the-default-network", "two-networks-all-share"],
)
def test_networks_that_keep_no_two_services_apart_are_honoured_with_their_aliases(tmp_path, text):
    read = project(tmp_path, text)
    assert set(read.names) <= set(read.host_names)
    if "aliases" in text:
        assert "database" in read.host_names and "database" in hosts_file(read.host_names, "0123456789ab", [])


@pytest.mark.parametrize(
    ("text", "named"),
    [
        (
            "services:\n  main: {networks: [front]}\n  api: {image: x, networks: [front, back]}\n  db: {image: x, networks: [back]}\nnetworks: {front: {}, back: {}}\n",
            "services.main (networks ['front']) and services.db (networks ['back']) share no network, so compose would keep them apart",
        ),
        ("services:\n  main: {}\n  db: {image: x, networks: [back]}\nnetworks: {back: {}}\n", "services.main (networks ['default']) and services.db"),
        ("services:\n  main: {networks: [outside]}\nnetworks: {outside: {external: true}}\n", "networks.outside.external: a trial joins none of the host's networks"),
        ("services:\n  main: {networks: [n]}\nnetworks: {n: {internal: true}}\n", 'networks.n.internal: to keep a trial from the outside, set task.toml\'s '
            '[environment] network_mode = "no-network"'),
        ("services:\n  main: {networks: [n]}\nnetworks: {n: {driver: macvlan}}\n", "networks.n.driver: 'macvlan'; only a plain bridge network is honoured"),
        ("services:\n  main: {networks: [n]}\nnetworks: {n: {driver_opts: {mtu: 1400}}}\n", "networks.n.driver_opts cannot be honoured"),
        ("services:\n  main: {networks: [n]}\nnetworks: {n: {ipam: {config: [{subnet: 10.5.0.0/16}]}}}\n", "networks.n.ipam cannot be honoured"),
        ("services:\n  main: {networks: {n: {ipv4_address: 10.5.0.5}}}\nnetworks: {n: {}}\n", "services.main.networks.n.ipv4_address cannot be honoured"),
    ],
    ids=["isolating-networks", "default-and-another", "external", "internal", "driver", "driver-options", "ipam", "fixed-address"],
)
def test_networks_a_pod_cannot_honour_are_refused_naming_the_key_and_the_fix(tmp_path, text, named):
    with pytest.raises(ComposeNotSupported) as refused:
        project(tmp_path, text)
    assert named in str(refused.value) and str(tmp_path / "docker-compose.yaml") in str(refused.value)


#: A main service and two beside it, in the shapes public tasks use.
TWO_SERVICES = """services:
  main:
    depends_on:
      api: {condition: service_healthy}
      seed: {condition: service_completed_successfully}
  api:
    build: {context: ./api, dockerfile: api.Dockerfile}
    command: python3 -m http.server 8000 --directory '/srv/my files'
    environment: {GREETING: "cost $$5"}
    working_dir: /srv
    user: "1000"
    init: true
    ports: ["8000:8000"]
    healthcheck:
      test: [CMD, curl, -f, "http://localhost:8000/"]
      interval: 500ms
      timeout: 2s
      retries: 10
      start_period: 1m30s
  seed:
    image: debian:bookworm-slim
    entrypoint: [sh, -c]
    command: ["echo seeded"]
    depends_on: [api]
  later:
    image: debian:bookworm-slim
    profiles: [debug]
"""


def write_api(tmp_path):
    (tmp_path / "api").mkdir()
    (tmp_path / "api" / "api.Dockerfile").write_text("FROM debian:bookworm-slim\n")


def test_services_beside_main_are_read_as_compose_runs_them(tmp_path):
    write_api(tmp_path)
    read = project(tmp_path, TWO_SERVICES)
    api, seed = read.services["api"], read.services["seed"]
    assert read.names == ["main", "api", "seed"], "a service with a profile is not started, as by `compose up`"
    assert [service.name for service in read.start_order] == ["api", "seed", "main"]
    assert read.main.depends_on == {"api": "service_healthy", "seed": "service_completed_successfully"}
    assert (api.build.context, api.build.dockerfile) == (tmp_path / "api", tmp_path / "api" / "api.Dockerfile")
    assert api.command == ["python3", "-m", "http.server", "8000", "--directory", "/srv/my files"]
    assert (api.environment, api.working_dir) == ({"GREETING": "cost $5"}, "/srv")
    assert api.run_args() == ["--user", "1000", "--init"]
    assert api.healthcheck == Healthcheck(test=("curl", "-f", "http://localhost:8000/"), interval_sec=0.5, timeout_sec=2, retries=10, start_period_sec=90)
    assert (api.healthcheck.poll_sec, api.healthcheck.deadline_sec) == (0.5, 95.5)
    assert (seed.image, seed.entrypoint, seed.command, seed.depends_on) == ("debian:bookworm-slim", ["sh", "-c"], ["echo seeded"], {"api": "service_started"})


def test_every_service_name_resolves_to_the_pods_loopback():
    hosts = hosts_file(["main", "api", "db"], "0123456789ab", [("mirror.internal", "10.1.2.3")])
    assert "127.0.0.1\tmain api db\n" in hosts and "127.0.0.1\t0123456789ab\n" in hosts
    assert hosts.endswith("10.1.2.3\tmirror.internal\n") and hosts.startswith("127.0.0.1\tlocalhost\n")


def test_a_host_path_mount_becomes_an_empty_folder_with_a_warning_and_the_host_is_never_read(tmp_path, monkeypatch):
    """SkillsBench tasks mount ${HOME}/.config/gcloud for optional credentials: Docker would mount it; here the task runs without it."""
    monkeypatch.setenv("HOME", "/home/the-sweeps-owner")
    read = project(tmp_path, (
        "services:\n  main:\n    volumes:\n      - ${HOME}/.config/gcloud:/root/.config/gcloud:ro\n"
        "      - {type: bind, source: ./data, target: /srv/data}\n      - {type: tmpfs, target: /scratch}\n"
        "  db: {image: x, volumes: ['/var/run/docker.sock:/var/run/docker.sock']}\n"
    ))  # fmt: skip
    assert read.main.empty_folders == [("/root/.config/gcloud", True), ("/srv/data", False), ("/scratch", False)]
    assert read.main.run_args() == [
        "--tmpfs", "/root/.config/gcloud:ro,exec,mode=0755", "--tmpfs", "/srv/data:rw,exec,mode=0755", "--tmpfs", "/scratch:rw,exec,mode=0755",
    ]  # fmt: skip
    assert read.services["db"].empty_folders == [("/var/run/docker.sock", False)]
    warnings = "\n".join(read.warnings)
    assert "services.main.volumes[0]: the host path '/.config/gcloud' is not mounted" in warnings, "HOME is not passed through: compose's empty"
    assert "/root/.config/gcloud is an empty folder instead" in warnings and "services.db.volumes[0]: the host path '/var/run/docker.sock'" in warnings
    assert "/scratch" not in warnings, "a tmpfs is honoured, nothing to warn about"
    assert "the-sweeps-owner" not in warnings

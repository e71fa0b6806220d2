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
        ("services:\n  main:\n    volumes: [/etc:/host-etc]\n", "services.main.volumes: host mounts are not given"),
        ("services:\n  main:\n    command: python server.py\n", "services.main.command"),
        ("services:\n  main:\n    network_mode: host\n", "services.main.network_mode: 'host'"),
        ("services:\n  main: {}\nnetworks: {x: {}}\n", "top-level networks"),
        ("services:\n  db: {environment: {A: b}}\n", "services.db: a service beside main needs a build or an image"),
        ("services:\n  db: {image: x, privileged: true}\n", "services.db.privileged cannot be honoured"),
        ("services:\n  db: {image: x, cap_add: [NET_ADMIN]}\n", "services.db.cap_add cannot be honoured"),
        ("services:\n  db: {image: x, volumes: ['/:/host']}\n", "services.db.volumes cannot be honoured"),
        ("services:\n  db: {image: x, network_mode: host}\n", "services.db.network_mode cannot be honoured"),
        ("services:\n  db: {image: x, networks: [back]}\n", "services.db.networks cannot be honoured"),
        ("services:\n  db: {image: 'postgres:${TAG}'}\n", "services.db.image: 'postgres:${TAG}' reads a host variable"),
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
    ],
)
def test_what_the_sandbox_cannot_honour_is_refused_naming_the_key(tmp_path, text, named):
    with pytest.raises(ComposeNotSupported) as refused:
        project(tmp_path, text)
    assert named in str(refused.value)


def test_dollars_are_unescaped_and_host_variables_refused(tmp_path):
    settings = compose(tmp_path, 'services:\n  main:\n    entrypoint: ["/bin/sh", "-c", "exec \\"$$@\\"", "--"]\n')
    assert settings.entrypoint == ["/bin/sh", "-c", 'exec "$@"', "--"]
    with pytest.raises(ComposeNotSupported, match=r"environment.TOKEN: '\$\{AWS_SECRET_ACCESS_KEY\}' reads a host variable"):
        compose(tmp_path, "services:\n  main:\n    environment:\n      TOKEN: ${AWS_SECRET_ACCESS_KEY}\n")


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

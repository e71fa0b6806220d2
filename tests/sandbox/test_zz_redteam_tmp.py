"""Red-team probes of the allowlist proxy (temporary; lives in /tmp/redteam-egress)."""
import asyncio, json, os, socket, threading, time
import pytest
from harbor.models.task.config import NetworkMode, NetworkPolicy
from prefect_harbor.sandbox import egress

pytestmark = pytest.mark.integration
OUT = "/tmp/redteam-egress/results"
os.makedirs(OUT, exist_ok=True)

def dump(name, obj):
    with open(f"{OUT}/{name}.json", "w") as f:
        json.dump(obj, f, indent=1, default=str)
    print(name, json.dumps(obj, indent=1, default=str)[:20000])

class Listener:
    """Host services: on loopback and on all interfaces; log every hit."""
    def __init__(self):
        self.hits = []
        self.socks = []
        self.port_lo = self._serve(socket.AF_INET, ("127.0.0.1", 0))
        self.port_any = self._serve(socket.AF_INET6, ("::", 0), dual=True)
    def _serve(self, fam, addr, dual=False):
        s = socket.socket(fam)
        if dual: s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        s.bind(addr); s.listen(64); self.socks.append(s)
        port = s.getsockname()[1]
        def loop():
            while True:
                try: c, a = s.accept()
                except OSError: return
                self.hits.append((port, a[0]))
                try:
                    c.settimeout(2); c.recv(4096)
                except OSError: pass
                try: c.sendall(b"HTTP/1.0 200 OK\r\n\r\nREDTEAM-SECRET-FROM-HOST\n")
                except OSError: pass
                c.close()
        threading.Thread(target=loop, daemon=True).start()
        return port

async def run_py(env, code, args="", timeout_note=""):
    done = await env.exec(f"cat > /tmp/p.py <<'PY'\n{code}\nPY\npython3 /tmp/p.py {args}")
    return done

def report(env):
    return [e for p in (env.trial_paths.trial_dir / "sandbox").glob("*.json") for e in json.loads(p.read_text()).get("network", [])]

def valid_hosts(cands):
    ok = []
    for h in cands:
        try:
            NetworkPolicy(network_mode=NetworkMode.ALLOWLIST, allowed_hosts=[h]); ok.append(h)
        except Exception:
            pass
    return ok

PROBE1 = r'''
import json, socket, sys
P_LO, P_ANY = int(sys.argv[1]), int(sys.argv[2])
def talk(req, after=None, wait=6):
    try:
        s = socket.create_connection(("127.0.0.1", 3128), timeout=wait)
        s.sendall(req)
        data = b""
        try:
            while len(data) < 8192:
                d = s.recv(4096)
                if not d: break
                data += d
                if after is not None and b"\r\n\r\n" in data and data.startswith(b"HTTP/1.1 200 Connection"):
                    s.sendall(after); after = None
        except OSError: pass
        s.close()
        return ("SECRET! " if b"REDTEAM-SECRET" in data else "") + data.split(b"\r\n")[0].decode("latin-1") + " | " + data[-160:].decode("latin-1").replace("\r\n"," ")
    except OSError as e:
        return type(e).__name__
out = {}
spell = ["127.0.0.1","localhost","LOCALHOST","localhost.","127.1","0x7f000001","2130706433","0177.0.0.1","0x7f.1","[::1]","[::ffff:127.0.0.1]","[::ffff:7f00:1]","[0:0:0:0:0:ffff:127.0.0.1]",
 "[::127.0.0.1]","[::ffff:0:127.0.0.1]","0.0.0.0","0","[::]","localhost.localdomain","foo.localhost","ip6-localhost","192.0.2.2","[fd00::2]","10.89.0.1","10.88.0.1","127.0.0.1.","127.0.0.2","[fe80::1%25lo]","169.254.169.254"]
for h in spell:
    for port in (P_LO, P_ANY):
        out[f"CONNECT {h}:{port}"] = talk(f"CONNECT {h}:{port} HTTP/1.1\r\nHost: {h}:{port}\r\n\r\n".encode(), after=b"GET / HTTP/1.0\r\n\r\n")
        out[f"GET http://{h}:{port}/"] = talk(f"GET http://{h}:{port}/ HTTP/1.1\r\nHost: {h}:{port}\r\n\r\n".encode())
# userinfo / fragment / backslash confusions
for t in [f"pypi.org@127.0.0.1:{P_LO}", f"127.0.0.1:{P_LO}#@pypi.org", f"127.0.0.1:{P_LO}\\@pypi.org", f"pypi.org:{P_LO}", f"pypi.org:443/../127.0.0.1:{P_LO}"]:
    out["CONNECT "+t] = talk(f"CONNECT {t} HTTP/1.1\r\n\r\n".encode(), after=b"GET / HTTP/1.0\r\n\r\n")
    out["GET http://"+t] = talk(f"GET http://{t}/ HTTP/1.1\r\nHost: x\r\n\r\n".encode())
# Host header differs from the target
out["GET pypi Host: 127.0.0.1"] = talk(f"GET http://pypi.org/ HTTP/1.1\r\nHost: 127.0.0.1:{P_LO}\r\n\r\n".encode())
# keep-alive: second request on same connection for host loopback
out["keepalive"] = talk(f"GET http://pypi.org/ HTTP/1.1\r\nHost: pypi.org\r\nConnection: keep-alive\r\n\r\nGET http://127.0.0.1:{P_LO}/ HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
# pipelined: CONNECT to allowed + a second CONNECT
out["pipelined-connect"] = talk(f"CONNECT pypi.org:443 HTTP/1.1\r\n\r\nCONNECT 127.0.0.1:{P_LO} HTTP/1.1\r\n\r\n".encode())
# lower-case method / odd methods
out["lower connect"] = talk(f"connect 127.0.0.1:{P_LO} HTTP/1.1\r\n\r\n".encode())
out["GET no scheme"] = talk(f"GET //127.0.0.1:{P_LO}/ HTTP/1.1\r\n\r\n".encode())
out["GET https scheme"] = talk(f"GET https://127.0.0.1:{P_LO}/ HTTP/1.1\r\n\r\n".encode())
print(json.dumps(out))
'''

async def test_loopback_spellings(make_environment):
    L = Listener()
    cands = ["127.0.0.0/8", "0.0.0.0/0", "::/0", "localhost", "*.localhost", "localhost.localdomain", "ip6-localhost", "127.1", "2130706433",
             "0x7f000001", "0177.0.0.1", "0x7f.1", "0", "pypi.org", "*.pypi.org", "10.0.0.0/8", "192.0.2.0/24", "fd00::/8", "::1", "::ffff:127.0.0.1", "127.0.0.1.", "localhost.", "*.org"]
    allowed = valid_hosts(cands)
    env = make_environment(network_mode=NetworkMode.ALLOWLIST, allowed_hosts=allowed)
    await env.start(force_build=False)
    try:
        done = await run_py(env, PROBE1, f"{L.port_lo} {L.port_any}")
    finally:
        await env.stop(delete=True)
    res = json.loads(done.stdout.strip().splitlines()[-1]) if done.return_code == 0 else {"rc": done.return_code, "err": done.stderr}
    dump("loopback", {"allowed_hosts": allowed, "rejected_by_validation": sorted(set(cands) - set(allowed)), "results": res, "host_hits": L.hits,
                      "report": [(e["host"], e["port"], e["allowed"], e["why"][:80]) for e in report(env)]})
    assert not L.hits, L.hits

PROBE2 = r'''
import json, os, socket, subprocess, sys
out = {}
def t(name, fn):
    try: out[name] = fn()
    except Exception as e: out[name] = f"{type(e).__name__}: {e}"
out["ifaces"] = open("/proc/net/dev").read().split("\n")[2:]
out["route"] = open("/proc/net/route").read()
out["unix_abstract_visible"] = [l for l in open("/proc/net/unix").read().splitlines() if "@" in l][:20]
def udp():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(3); s.sendto(b"x", ("8.8.8.8", 53)); return "sent"
t("udp 8.8.8.8", udp)
def udp6():
    s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM); s.sendto(b"x", ("2001:4860:4860::8888", 53)); return "sent"
t("udp6", udp6)
t("raw", lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP) and "raw ok")
t("packet", lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW) and "packet ok")
t("tcp 203.0.113.80", lambda: socket.create_connection(("203.0.113.80", 443), timeout=3) and "connected")
t("tcp6 fd00::1", lambda: socket.create_connection(("fd00::1", 80), timeout=3) and "connected")
def absu():
    s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1].encode().replace(b"@", b"\0", 1)); return "CONNECTED to host abstract socket: " + s.recv(100).decode()
t("abstract host socket", absu)
t("resolv", lambda: open("/etc/resolv.conf").read())
t("getaddrinfo", lambda: socket.getaddrinfo("pypi.org", 443) and "resolved")
t("ip link add", lambda: subprocess.run(["sh","-c","cat /proc/self/status | grep Cap"], capture_output=True, text=True).stdout)
def netlink():
    s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0); return "netlink ok"
t("netlink route", netlink)
def listen_any():
    s = socket.socket(socket.AF_INET6); s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0); s.bind(("::", 3128)); s.listen(); return "bound [::]:3128 dual"
t("bind [::]:3128", listen_any)
def v6lo():
    s = socket.socket(socket.AF_INET6); s.bind(("::1", 3128)); s.listen(); return "bound [::1]:3128"
t("bind [::1]:3128", v6lo)
def reuseport():
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("127.0.0.1", 3128)); s.listen(); return "bound with REUSEPORT"
t("bind reuseport 127.0.0.1:3128", reuseport)
def any4():
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("0.0.0.0", 3128)); s.listen(); return "bound 0.0.0.0:3128"
t("bind 0.0.0.0:3128", any4)
def lo2():
    s = socket.socket(); s.bind(("127.0.0.2", 3128)); s.listen(); return "bound 127.0.0.2:3128"
t("bind 127.0.0.2:3128", lo2)
def still():
    s = socket.create_connection(("127.0.0.1", 3128), timeout=5); s.sendall(b"CONNECT nope.example:443 HTTP/1.1\r\n\r\n"); return s.recv(300).decode()
t("proxy still answers", still)
t("localhost resolves to", lambda: socket.getaddrinfo("localhost", 3128, type=socket.SOCK_STREAM))
print(json.dumps(out))
'''

async def test_no_proxy_escapes(make_environment):
    name = f"@redteam-abs-{os.getpid()}"
    a = socket.socket(socket.AF_UNIX); a.bind(b"\0" + name[1:].encode()); a.listen()
    def loop():
        while True:
            try: c, _ = a.accept()
            except OSError: return
            c.sendall(b"HOST-ABSTRACT"); c.close()
    threading.Thread(target=loop, daemon=True).start()
    env = make_environment(network_mode=NetworkMode.ALLOWLIST, allowed_hosts=["pypi.org"])
    await env.start(force_build=False)
    try:
        done = await run_py(env, PROBE2, name)
    finally:
        await env.stop(delete=True)
    res = json.loads(done.stdout.strip().splitlines()[-1]) if done.return_code == 0 else {"rc": done.return_code, "err": done.stderr}
    dump("noproxy", res)

PROBE_FRONT = r'''
import json, socket, ssl
def talk(req, tls_sni=None, inner=None):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
    s.sendall(req)
    if tls_sni:
        head = b""
        while b"\r\n\r\n" not in head: head += s.recv(1)
        ctx = ssl.create_default_context(); ctx.check_hostname = False; ctx.verify_mode = ssl.CERT_NONE
        try:
            s = ctx.wrap_socket(s, server_hostname=tls_sni)
        except Exception as e:
            return head.decode().split("\r\n")[0] + " / TLS " + type(e).__name__ + str(e)[:100]
        s.sendall(inner)
    data = b""
    try:
        while len(data) < 3000:
            d = s.recv(4096)
            if not d: break
            data += d
    except OSError as e: pass
    return data[:600].decode("latin-1")
out = {}
out["GET pypi.org Host deb.debian.org"] = talk(b"GET http://pypi.org/debian/dists/bookworm/Release HTTP/1.1\r\nHost: deb.debian.org\r\n\r\n")
out["GET deb.debian.org direct (not allowed)"] = talk(b"GET http://deb.debian.org/debian/dists/bookworm/Release HTTP/1.1\r\nHost: deb.debian.org\r\n\r\n")
out["GET pypi.org Host files.pythonhosted.org"] = talk(b"GET http://pypi.org/ HTTP/1.1\r\nHost: files.pythonhosted.org\r\n\r\n")
out["CONNECT pypi.org SNI deb.debian.org"] = talk(b"CONNECT pypi.org:443 HTTP/1.1\r\n\r\n", tls_sni="deb.debian.org", inner=b"GET /debian/dists/bookworm/Release HTTP/1.1\r\nHost: deb.debian.org\r\nConnection: close\r\n\r\n")
out["CONNECT pypi.org SNI pypi.org"] = talk(b"CONNECT pypi.org:443 HTTP/1.1\r\n\r\n", tls_sni="pypi.org", inner=b"GET /simple/ HTTP/1.1\r\nHost: pypi.org\r\nConnection: close\r\n\r\n")
print(json.dumps(out))
'''

async def test_domain_fronting(make_environment):
    env = make_environment(network_mode=NetworkMode.ALLOWLIST, allowed_hosts=["pypi.org"])
    await env.start(force_build=False)
    try:
        done = await run_py(env, PROBE_FRONT)
    finally:
        await env.stop(delete=True)
    res = json.loads(done.stdout.strip().splitlines()[-1]) if done.return_code == 0 else {"rc": done.return_code, "err": done.stderr[-2000:]}
    dump("fronting", {"results": res, "report": [(e["host"], e["port"], e["allowed"]) for e in report(env)]})

FLOOD = r'''
import json, socket, sys, time
N, L = int(sys.argv[1]), int(sys.argv[2])
times = {}
t0 = time.time()
for i in range(N):
    t = time.time()
    s = socket.create_connection(("127.0.0.1", 3128), timeout=600)
    host = ("a" * L) + f"{i}.\x1b[31mEVIL\x1b[0m.example"
    s.sendall(f"CONNECT {host}:443 HTTP/1.1\r\n\r\n".encode("latin-1"))
    r = s.recv(200)
    s.close()
    if i % 50 == 0 or i == N - 1:
        times[i] = round(time.time() - t, 3)
times["total"] = round(time.time() - t0, 1)
print(json.dumps(times))
'''
LATENCY = r'''
import json, socket, sys, time
res = []
end = time.time() + float(sys.argv[1])
while time.time() < end:
    t = time.time()
    s = socket.create_connection(("127.0.0.1", 3128), timeout=600)
    s.sendall(b"CONNECT pypi.org:443 HTTP/1.1\r\n\r\n")
    s.recv(200); s.close()
    res.append(round(time.time() - t, 3))
    time.sleep(0.5)
print(json.dumps({"n": len(res), "max": max(res), "median": sorted(res)[len(res)//2], "all": res[:80]}))
'''

async def test_report_flood(make_environment):
    import resource
    a = make_environment(network_mode=NetworkMode.ALLOWLIST, allowed_hosts=["pypi.org"])
    b = make_environment(network_mode=NetworkMode.ALLOWLIST, allowed_hosts=["pypi.org"])
    await a.start(force_build=False); await b.start(force_build=False)
    try:
        base = await run_py(b, LATENCY, "5")
        await a.exec(f"cat > /tmp/f.py <<'PY'\n{FLOOD}\nPY\n")
        await b.exec(f"cat > /tmp/l.py <<'PY'\n{LATENCY}\nPY\n")
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        t = time.time()
        flood, during = await asyncio.gather(a.exec("python3 /tmp/f.py 250 60000"), b.exec("python3 /tmp/l.py 40"))
        took = time.time() - t
        rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        sizes = {p.name: p.stat().st_size for p in (a.trial_paths.trial_dir / "sandbox").glob("*.json")}
        rep = report(a)
    finally:
        await a.stop(delete=True); await b.stop(delete=True)
    dump("flood", {"baseline_B": base.stdout, "flood_A": flood.stdout + flood.stderr[-500:], "B_during": during.stdout, "took": took, "report_sizes": sizes,
                   "entries": len(rep), "sample_host_repr": repr(rep[-1]["host"][-40:]) if rep else None, "rss_kb_before_after": (rss0, rss1)})

"""Secrets put into a VM's HTTPS requests (docs/secrets.md,
`linnet-secrets`): what the network's secrets proxy costs a request. Two
guests on the network `secrets` (`linnet run --datapath tap`, the stand-in
as VMM, MTU 1500), each allowed `api.bench.test:443` by name and resolving
it through linnet's DNS (a dnsmasq of this module's on 127.0.0.1:5355):

- `direct`: the request as it is without a secret rule, its connection
  checked by the gate (`linnet-gate`) and then in the kernel;
- `secret`: `--secret TOKEN@api.bench.test` too, so each connection to
  the name's address on 443 is steered to the proxy, which terminates
  TLS with a leaf of the network's CA, dials the server (checked against
  the network's `upstream_ca:`, this module's CA) and puts the secret
  into each request's `Authorization` header.

The server: nginx in a namespace of its own behind a veth (the guests'
connections cross the FORWARD hook), HTTP/1.1 and HTTP/2 over TLS, a
small page and a large file. curl in the guest, which times each
transfer itself (`time_total`). Measured, in turns, each round:

- a request on a connection of its own (NEW_PER_ROUND curl runs a guest
  and round): handshake(s) and the request, p50 and p99;
- a request on a kept-alive connection (KEPT_PER_ROUND requests of one
  curl, HTTP/1.1, the first left out): p50 and p99, and the requests a
  second they add up to;
- a download of the large file (DOWNLOADS_PER_ROUND a guest and round):
  its speed, every download pooled as gate.py's are.
"""
import os
import statistics
import subprocess

from .host import BenchError, run, wait_for
from .names import percentile
from .setups import run_guest, server_ns
from .throughput import summarize

SETUP = "linnet secrets proxy"
NETWORK = "secrets"
DNS_PORT = 5355
NAME = "api.bench.test"
SERVER_NET = "10.206.0"
SERVER = f"{SERVER_NET}.2"
SERVER_LINK = "bsec0"
NEW_PER_ROUND = 60
KEPT_PER_ROUND = 400
DOWNLOADS_PER_ROUND = 5
BIG_BYTES = 256 << 20
SECRET = "bench-secret-value-0123456789"
GUESTS = {
    "direct": ["--allow-connect", f"{NAME}:443"],
    "secret": ["--allow-connect", f"{NAME}:443", "--secret", f"TOKEN@{NAME}"],
}
# Not measured: OpenSandbox's figure for its MITM egress proxy, per request.
OPENSANDBOX_MS = 290


def upstream_ca_path(workdir):
    """Where the network `secrets` (env.NETWORKS_YAML) finds the server's
    CA: this module writes it there before the first guest attaches."""
    return os.path.join(workdir, "secrets-upstream-ca.pem")


class World:
    def __init__(self, env):
        self.env = env
        self.dir = env.fresh_path("secrets")
        os.makedirs(os.path.join(self.dir, "tmp"))
        self.guests = {}
        self.network_ca = None

    def certificates(self):
        """A CA (the network's upstream_ca) and the server's leaf of it."""
        d = self.dir
        ca_key, ca, key, csr, cert = (os.path.join(d, n) for n in
                                      ("ca.key", "ca.pem", "server.key", "server.csr", "server.pem"))
        run("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
            "-nodes", "-keyout", ca_key, "-out", ca, "-days", "2", "-subj", "/CN=bench upstream CA")
        run("openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", key, "-out", csr, "-subj", f"/CN={NAME}")
        ext = os.path.join(d, "ext.cnf")
        with open(ext, "w") as f:
            f.write(f"subjectAltName=DNS:{NAME}\nextendedKeyUsage=serverAuth\n")
        run("openssl", "x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial",
            "-out", cert, "-days", "2", "-extfile", ext)
        with open(ca) as src, open(upstream_ca_path(self.env.workdir), "w") as dst:
            dst.write(src.read())
        self.upstream_ca = ca
        return cert, key

    def start_server(self):
        ns = server_ns(self.env, "secretsrv", SERVER_LINK, SERVER_NET)
        cert, key = self.certificates()
        d = self.dir
        with open(os.path.join(d, "big"), "wb") as f:
            f.truncate(BIG_BYTES)
        conf = os.path.join(d, "nginx.conf")
        with open(conf, "w") as f:
            f.write(f"""master_process off;
daemon off;
user root;
pid {d}/nginx.pid;
error_log {d}/error.log;
events {{}}
http {{
    client_body_temp_path {d}/tmp; proxy_temp_path {d}/tmp; fastcgi_temp_path {d}/tmp;
    uwsgi_temp_path {d}/tmp; scgi_temp_path {d}/tmp;
    access_log off;
    sendfile on;
    keepalive_requests 100000;
    server {{
        listen {SERVER}:443 ssl http2;
        server_name {NAME};
        ssl_certificate {cert};
        ssl_certificate_key {key};
        root {d};
        location = /small {{ return 200 "hello from the bench\\n"; }}
        location = /authorized {{
            if ($http_authorization = "Bearer {SECRET}") {{ return 200 "authorized\\n"; }}
            return 401;
        }}
    }}
}}
""")
        self.env.procs.start("secrets-nginx", ["nginx", "-c", conf], ns=ns)
        wait_for(lambda: self.env.procs.check_alive() or
                 "LISTEN" in run("ss", "-Htln", "sport = :443", ns=ns), "the secrets bench's nginx")

    def start_dns(self):
        self.env.procs.start("secrets-dnsmasq", [
            "dnsmasq", "--keep-in-foreground", "--no-resolv", "--no-hosts", "--bind-interfaces",
            "--user=root", "--listen-address=127.0.0.1", f"--port={DNS_PORT}", "--local-ttl=3600",
            f"--host-record={NAME},{SERVER}", "--pid-file="])

    def linnet(self, *args, stdin=None):
        r = subprocess.run([self.env.linnet.bin, *args], env={**os.environ, **self.env.linnet.env},
                           input=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           timeout=30)
        if r.returncode != 0:
            raise BenchError(f"linnet {' '.join(args)}: {r.stderr.strip()}")
        return r.stdout

    def attach(self, key, flags):
        ns, info, _, _ = run_guest(self.env, NETWORK, ["--name", f"secrets-{key}", *flags])
        self.guests[key] = ns
        gateway = info["gateway"]
        wait_for(lambda: SERVER in run("nslookup", "-timeout=2", NAME, gateway, ns=ns, check=False),
                 f"{NAME} through linnet's DNS in {ns}")
        return ns

    def ca_of(self, key):
        return self.network_ca if key == "secret" else self.upstream_ca

    def curl(self, key, *args, timeout=120):
        r = subprocess.run(["ip", "netns", "exec", self.guests[key], "curl", "-sS", "-g",
                            "--cacert", self.ca_of(key), "--resolve", f"{NAME}:443:{SERVER}",
                            "-H", "Authorization: Bearer {{secret:TOKEN}}", *args],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout)
        if r.returncode != 0:
            raise BenchError(f"curl in the {key} guest: {r.stderr.strip()[-300:]}")
        return r.stdout


def new_connection_ms(world, key):
    """One request on a connection of its own: curl's time_total, ms."""
    out = world.curl(key, "-o", "/dev/null", "-w", "%{time_total}", f"https://{NAME}/small")
    return float(out) * 1000


def kept_alive_ms(world, key, n):
    """`n` requests on one kept-alive HTTP/1.1 connection: each one's time
    but the first's (which opens the connection), ms."""
    # `-o` holds for one URL: one each.
    urls = [arg for _ in range(n) for arg in ("-o", "/dev/null", f"https://{NAME}/small")]
    out = world.curl(key, "--http1.1", "-w", "%{time_total} %{num_connects}\\n", *urls)
    lines = [line.split() for line in out.splitlines()]
    if len(lines) != n or any(c != "0" for _, c in lines[1:]):
        raise BenchError(f"the {key} guest's {n} requests did not share one connection: "
                         f"{out[:200]!r}")
    return [float(t) * 1000 for t, _ in lines[1:]]


def download(world, key, round_):
    out = world.curl(key, "-o", "/dev/null", "-w", "%{speed_download} %{size_download}",
                     f"https://{NAME}/big")
    speed, got = (float(x) for x in out.split())
    if got != BIG_BYTES:
        raise BenchError(f"the {key} guest's download got {got:.0f} of {BIG_BYTES} bytes")
    return {"gbps": speed * 8 / 1e9, "bytes": int(got), "retransmits": None, "round": round_,
            "net_cpu_s_per_gb": 0.0, "standin_cpu_s_per_gb": 0.0, "all_cpu_s_per_gb": 0.0}


def quantiles(samples):
    return {"p50_ms": round(percentile(samples, 50), 3), "p99_ms": round(percentile(samples, 99), 3),
            "count": len(samples)}


def measure_all(env, seconds, runs, log):
    world = World(env)
    try:
        world.start_server()
        world.start_dns()
        world.linnet("secret", "set", "TOKEN", stdin=SECRET)
        world.network_ca = os.path.join(world.dir, "network-ca.pem")
        with open(world.network_ca, "w") as f:
            f.write(world.linnet("ca", "--network", NETWORK))
        for key, flags in GUESTS.items():
            world.attach(key, flags)
        # The proxy is in the secret guest's path and the gate alone in the
        # direct guest's: each sees its own CA's certificate, and only the
        # network's CA vouches for the secret guest's.
        for key in GUESTS:
            if "hello from the bench" not in world.curl(key, f"https://{NAME}/small"):
                raise BenchError(f"the {key} guest's request did not come back")
        # The secret reaches the server from the secret guest alone (the
        # server says whether it came, never what it was).
        for key, want in (("secret", "200"), ("direct", "401")):
            got = world.curl(key, "-o", "/dev/null", "-w", "%{http_code}", f"https://{NAME}/authorized")
            if got != want:
                raise BenchError(f"the {key} guest's request with the placeholder got {got}, not {want}")
        probe = subprocess.run(["ip", "netns", "exec", world.guests["secret"], "curl", "-sS",
                                "--cacert", world.upstream_ca, "--resolve", f"{NAME}:443:{SERVER}",
                                f"https://{NAME}/small"], capture_output=True, text=True, timeout=30)
        if probe.returncode == 0:
            raise BenchError("the secret guest's connection was not the proxy's")
        new = {k: [] for k in GUESTS}
        kept = {k: [] for k in GUESTS}
        rps = {k: [] for k in GUESTS}
        rows = {k: [] for k in GUESTS}
        every = {k: [] for k in GUESTS}
        failures = {k: [] for k in GUESTS}
        keys = list(GUESTS)
        for r in range(runs):
            for i in range(NEW_PER_ROUND):
                for key in keys[i % 2:] + keys[:i % 2]:
                    new[key].append(new_connection_ms(world, key))
            for key in keys[r % 2:] + keys[:r % 2]:
                times = kept_alive_ms(world, key, KEPT_PER_ROUND)
                kept[key] += times
                rps[key].append(round(len(times) / (sum(times) / 1000)))
            got = {k: [] for k in GUESTS}
            for i in range(DOWNLOADS_PER_ROUND):
                for key in keys[(r + i) % 2:] + keys[:(r + i) % 2]:
                    try:
                        got[key].append(download(world, key, r))
                    except BenchError as e:
                        failures[key].append(str(e))
            for key, downloads in got.items():
                every[key] += [d["gbps"] for d in downloads]
                if downloads:
                    rows[key].append(sorted(downloads, key=lambda d: d["gbps"])[len(downloads) // 2])
            log(f"  round {r + 1}: new connection p50 {statistics.median(new['direct']):.2f} / "
                f"{statistics.median(new['secret']):.2f} ms, kept alive "
                f"{statistics.median(kept['direct']):.3f} / {statistics.median(kept['secret']):.3f} ms, "
                f"{rps['direct'][-1]} / {rps['secret'][-1]} requests/s (direct / secret)")
        q_new = {k: quantiles(v) for k, v in new.items()}
        q_kept = {k: quantiles(v) for k, v in kept.items()}
        added = lambda q, p: round(q["secret"][p] - q["direct"][p], 3)
        return {
            "mtu": 1500, "big_bytes": BIG_BYTES,
            "new_connection": {**q_new, "added_p50_ms": added(q_new, "p50_ms"),
                               "added_p99_ms": added(q_new, "p99_ms")},
            "kept_alive": {**q_kept, "added_p50_ms": added(q_kept, "p50_ms"),
                           "added_p99_ms": added(q_kept, "p99_ms")},
            "requests_per_s": {k: {"median": round(statistics.median(v)), "rounds": v}
                               for k, v in rps.items()},
            "download_direct": {**summarize(rows["direct"], failures["direct"]),
                                "downloads_gbps": [round(x, 3) for x in every["direct"]]},
            "download_secret": {**summarize(rows["secret"], failures["secret"]),
                                "downloads_gbps": [round(x, 3) for x in every["secret"]]},
            "peer_ms": {"opensandbox_mitm": OPENSANDBOX_MS},
        }
    except (OSError, subprocess.SubprocessError, ValueError, BenchError) as e:
        raise BenchError(f"{type(e).__name__}: {e}; the daemon said: {said(env)}") from e
    finally:
        env.teardown()


def said(env):
    """The daemon's last lines about the secrets proxy, for a failure."""
    try:
        with open(env.linnet.procs.log(env.linnet.daemon), errors="replace") as f:
            lines = [line.strip() for line in f if "secret" in line]
    except OSError as e:
        return f"(its log: {e})"
    return " | ".join(lines[-6:]) or "nothing about secrets"

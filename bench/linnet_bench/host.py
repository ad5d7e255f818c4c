"""Commands, processes, namespaces and /proc readings for the benchmark.

Everything here runs inside scripts/sandbox: the "host" is the sandbox's own
network namespace and guests are `ip netns` namespaces inside it, so nothing
touches the machine's network and all of it vanishes when the run ends.
"""
import os
import shutil
import signal
import subprocess
import time

CLK_TCK = os.sysconf("SC_CLK_TCK")


class BenchError(Exception):
    """A step of the benchmark failed; the message names the step."""


def run(*args, ns=None, check=True):
    """Runs a command (in namespace `ns`), returns its stdout."""
    cmd = (["ip", "netns", "exec", ns] if ns else []) + [str(a) for a in args]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if check and r.returncode != 0:
        raise BenchError(f"`{' '.join(cmd)}` failed: {r.stderr.strip() or r.returncode}")
    return r.stdout


def ip(*args, ns=None):
    """`ip` in the host namespace, or with -n NS."""
    return run("ip", *(["-n", ns] if ns else []), *args)


def wait_for(condition, what, timeout=10.0, every=0.02):
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise BenchError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)


def link_exists(name, ns=None):
    cmd = ["ip"] + (["-n", ns] if ns else []) + ["link", "show", name]
    return subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0


class Processes:
    """Every process one setup starts, so its teardown stops them all."""

    def __init__(self, logdir):
        self.logdir = logdir
        self.procs = []

    def start(self, name, args, ns=None, env=None, pipe_stdout=False):
        """Starts a process logging to NAME.log (its stdout a pipe instead
        with `pipe_stdout`, for a first line to read)."""
        cmd = (["ip", "netns", "exec", ns] if ns else []) + [str(a) for a in args]
        with open(os.path.join(self.logdir, f"{name}.log"), "ab") as log:
            proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE if pipe_stdout else log,
                stderr=log, env=None if env is None else {**os.environ, **env})
        proc.bench_name = name
        self.procs.append(proc)
        return proc

    def check_alive(self):
        for p in self.procs:
            if p.poll() is not None:
                with open(self.log(p), errors="replace") as f:
                    last = " | ".join(f.read().strip().splitlines()[-3:])
                raise BenchError(f"{p.bench_name} exited with {p.returncode}: {last or 'no output'}")

    def log(self, proc):
        return os.path.join(self.logdir, f"{proc.bench_name}.log")

    def stop(self, proc, timeout=5):
        """Stops one process (SIGTERM, SIGKILL after `timeout` s) and forgets it."""
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs.remove(proc)

    def stop_all(self):
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in reversed(self.procs):
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs.clear()


def children(pid):
    """Direct children of `pid` (all its threads')."""
    kids = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                kids += [int(c) for c in f.read().split()]
    except FileNotFoundError:
        pass
    return kids


def cpu_seconds(pid):
    """User + system CPU of a process, all its threads, in seconds."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return 0.0
    # Fields after the command: state is field 3, utime 14, stime 15.
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def machine_busy_seconds():
    """CPU seconds the whole machine spent not idle, summed over cores."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    return (sum(values[:8]) - idle) / CLK_TCK


def memory_kib(pid, field="VmRSS"):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise BenchError(f"no {field} for pid {pid}")


def debian_version(binary):
    """The Debian package the `binary` on PATH comes from and its exact
    version ("passt 0.0~git20230309.7c7625d-1 (Debian)"), or where it is
    when no package owns it."""
    path = shutil.which(binary)
    if not path:
        return f"{binary}: not installed"
    path = os.path.realpath(path)
    owner = subprocess.run(["dpkg-query", "-S", path], stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, text=True)
    if owner.returncode != 0:
        return f"{path}: not from a Debian package"
    package = owner.stdout.split(":")[0]
    version = subprocess.run(["dpkg-query", "-W", "-f=${Version}", package], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True).stdout.strip()
    return f"{package} {version} (Debian)"


def go_module_version(binary):
    """The module and version a Go binary was built from, e.g.
    "github.com/containers/gvisor-tap-vsock v0.8.9 (Go module)": from the
    note scripts/install-deps writes beside the binary it builds (the
    benchmark may run where `go` is not on PATH, e.g. under sudo), else
    from `go version -m`."""
    try:
        with open(binary + ".version") as f:
            return f"{f.read().strip()} (Go module)"
    except FileNotFoundError:
        pass
    try:
        r = subprocess.run(["go", "version", "-m", binary], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unknown ({e})"
    for line in r.stdout.splitlines():
        fields = line.split()
        if fields[:1] == ["mod"] and len(fields) >= 3:
            return f"{fields[1]} {fields[2]} (Go module)"
    return "unknown (no module information in the binary)"

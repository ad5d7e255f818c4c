"""The programs linnet's tests, demo, benchmark and fuzz targets call, and
where each comes from: scripts/programs (the list) read, and the sources
scanned for the programs they name.

`scripts/check-install` installs scripts/install-deps into a bare Debian
root file system and finds every listed program there; the unit test
(scripts/tests/test_programs.py) keeps the list complete by scanning the
sources. Together they fail when a test needs a program that only a hand
install gave this machine.

What counts as "named" (read by `called`): in Rust and Python sources,
every string literal that is one bare word naming an executable on this
machine ("ip", "libvirtd", "zebra" under /usr/lib/frr); in shell scripts
and the Makefile, every word in a command's position. A word that is
also a program but is not called as one ("ls" as linnet's subcommand,
"link" as `ip link`) is in NOT_CALLED, with why.
"""
import os
import re
import shutil

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIST = os.path.join(ROOT, "scripts", "programs")
INSTALL_DEPS = os.path.join(ROOT, "scripts", "install-deps")

# Where a listed program may be: PATH (root's, so /usr/sbin too) and the
# directory FRR keeps its daemons in, which no PATH has.
SEARCH_DIRS = ["/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin",
               "/usr/lib/frr"]

# Packages that are not Debian packages install-deps installs:
# `minbase` is in every Debian root file system (coreutils, util-linux,
# dpkg...); `machine` comes with the machine, not from Debian (rustup's
# cargo, Go's own tarball), and is checked on the machine itself.
MINBASE = "minbase"
MACHINE = "machine"

# Words the sources use that name a program on some machine but are not
# called as one here.
NOT_CALLED = {
    "adduser": "a dependency of the .deb, read from its control file",
    "as": "a word in an FRR health message",
    "comm": "a sort key of perf report",
    "date": "a field of the benchmark's report",
    "docker": "Docker's nftables tables and chains, read, never run",
    "expr": "nftables JSON's rule expressions",
    "file": "a word in error messages",
    "host": "the host namespace, a JSON field",
    "id": "a JSON field",
    "idle": "a word in a test's name for the daemon's state",
    "kvm": "QEMU's -accel kvm",
    "last": "a JSON field",
    "more": "bytes a unit test of the gate sends",
    "mv": "a test guest's name",
    "link": "`ip link`",
    "ls": "`linnet ls`",
    "passwd": "/etc/passwd, edited in a test's own copy of /etc",
    "route": "`ip route`",
    "shutdown": "the shutdown(2) system call in the seccomp list",
    "size": "QEMU's memory size option",
    "ssh": "a port's name in policies",
    "sum": "a JSON field",
    "test": "a DNS name suffix",
    "w": "a file mode",
    "wget": "busybox's, inside the demo's VMs",
    "write": "the write(2) system call",
    "x86_64": "the seccomp filter's architecture",
}

# The sources scanned: (directory under ROOT, file suffixes); directories
# named in SKIP_DIRS are not entered.
SOURCES = [
    ("src", (".rs",)),
    ("tests", (".rs", ".py", ".script")),
    ("tools", (".rs",)),
    ("crates", (".rs",)),
    ("fuzz", (".rs",)),
    ("bench", (".py", "run")),
    ("scripts", ("",)),
    ("guest", (".script",)),
    (".ci", ("",)),
]
SKIP_DIRS = {"target", "corpus", "artifacts", "results", "__pycache__"}
# The list's own reader and its test name programs as data; the check
# itself runs on the machine, never in the root it builds, and installs
# what it needs (mmdebstrap) by itself.
SKIP_FILES = {"scripts/programs.py", "scripts/tests/test_programs.py", "scripts/check-install"}
SHELL_FILES = ("Makefile",)

LITERAL = re.compile(r'"([A-Za-z0-9_][A-Za-z0-9_.+-]*)"')
# What may come before a command in shell: a separator, a keyword, `exec`.
COMMAND_START = re.compile(r'(?:^|[;&|(`{]|\$\(|\bthen\b|\bdo\b|\belse\b|\bexec\b|\b!\s)\s*'
                           r'(?:[A-Za-z_][A-Za-z0-9_]*=\S*\s+)*'
                           r'([A-Za-z0-9_][A-Za-z0-9_.+-]*)(?=\s|$|;|\))')
SHELL_WORDS = set("""
if then else elif fi case esac for while until do done in function select time
break continue return exit export local readonly declare typeset unset shift set
source alias eval trap wait cd pwd echo printf read test true false kill jobs
command type hash getopts umask ulimit mapfile let shopt builtin
""".split())


class ListError(Exception):
    """scripts/programs is malformed; the message names the line."""


def listed(path=LIST):
    """{name: (path or name, package)} from the list; a program given by
    path (/usr/lib/frr/zebra) is named by its last component."""
    programs = {}
    with open(path) as f:
        for number, line in enumerate(f, 1):
            words = line.split("#", 1)[0].split()
            if not words:
                continue
            if len(words) != 2:
                raise ListError(f"{path}:{number}: expected PROGRAM PACKAGE, found {line.strip()!r}")
            program, package = words
            name = os.path.basename(program)
            if name in programs:
                raise ListError(f"{path}:{number}: {name} is listed twice")
            programs[name] = (program, package)
    return programs


def install_deps_packages(path=INSTALL_DEPS):
    """The Debian packages install-deps names: the words that begin the
    lines of its `packages=(`...`)` and `packages+=(`...`)` arrays, and
    those it adds one at a time (`packages+=(golang-go)`)."""
    packages = set()
    inside = False
    with open(path) as f:
        for line in f:
            code = line.split("#", 1)[0]
            one = re.search(r"packages\+?=\(([^)]*)\)", code)
            if one:
                packages.update(one.group(1).split())
                continue
            if re.search(r"packages\+?=\($", code.strip()):
                inside = True
                continue
            if inside:
                if code.strip() == ")":
                    inside = False
                else:
                    packages.update(code.split())
    return packages


def is_program(word, path):
    return shutil.which(word, path=path) is not None


def search_path():
    return os.pathsep.join([os.environ.get("PATH", "")] + SEARCH_DIRS)


def _source_files(root):
    for directory, suffixes in SOURCES:
        top = os.path.join(root, directory)
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS]
            for name in filenames:
                path = os.path.join(dirpath, name)
                if name.endswith(suffixes) and os.path.relpath(path, root) not in SKIP_FILES:
                    yield path
    for name in SHELL_FILES:
        path = os.path.join(root, name)
        if os.path.exists(path):
            yield path


def _is_shell(path):
    if os.path.basename(path) == "Makefile" or path.endswith(".script"):
        return True
    with open(path, "rb") as f:
        first = f.readline()
    return first.startswith(b"#!") and (b"sh" in first.split(b"/")[-1])


# A quoted string with no command substitution in it: text, not commands.
PLAIN_QUOTED = re.compile(r'"[^"$`]*"|\'[^\'\n]*\'')
HEREDOC = re.compile(r"<<-?\s*['\"]?([A-Za-z_]+)['\"]?")
ARRAY_START = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\+?=\($")


def _shell_commands(text):
    """The words in a command's position, line by line; not inside a
    here-document (text for another machine: a guest's script, a
    package's postinst) nor a multi-line array (package names)."""
    until = None
    for line in text.splitlines():
        line = line.lstrip("\t ")
        if until is not None:
            if line.strip() == until:
                until = None
            continue
        if line.startswith("#"):
            continue
        code = re.sub(r"(^|\s)#.*$", "", line).rstrip()
        if ARRAY_START.match(code):
            until = ")"
            continue
        heredoc = HEREDOC.search(code)
        if heredoc:
            until = heredoc.group(1)
        for match in COMMAND_START.finditer(PLAIN_QUOTED.sub('""', code)):
            yield match.group(1)


def _functions(text):
    return set(re.findall(r"^\s*([A-Za-z_][A-Za-z0-9_-]*)\s*\(\)", text, re.M))


def called(root=ROOT, path=None):
    """{program: sorted files naming it} over the sources under `root`,
    where a program is a word that names an executable on `path` (default:
    PATH and SEARCH_DIRS) and is not in NOT_CALLED."""
    path = path or search_path()
    found = {}
    for file in _source_files(root):
        with open(file, errors="replace") as f:
            text = f.read()
        if file.endswith((".rs", ".py")):
            words = LITERAL.findall(text)
        elif _is_shell(file):
            words = set(_shell_commands(text)) - SHELL_WORDS - _functions(text)
        else:
            continue
        for word in set(words):
            if word not in NOT_CALLED and is_program(word, path):
                found.setdefault(word, set()).add(os.path.relpath(file, root))
    return {word: sorted(files) for word, files in found.items()}

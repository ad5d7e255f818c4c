"""scripts/programs is complete: every program the sources call is listed,
and every listed package is one scripts/install-deps installs. With
scripts/check-install (which finds each listed program where only
install-deps was installed), a test that needs a hand-installed program
fails here first."""
import os
import stat
import sys
import tempfile
import textwrap
import unittest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import programs  # noqa: E402


class TheList(unittest.TestCase):
    def test_every_program_the_sources_call_is_listed(self):
        listed = programs.listed()
        missing = {p: files for p, files in programs.called().items() if p not in listed}
        self.assertEqual(
            missing, {},
            "called but not in scripts/programs (add each with the package that brings it, "
            "and that package to scripts/install-deps; or, if the word is not run as a "
            "program, to NOT_CALLED in scripts/programs.py)")

    def test_every_listed_package_is_installed_by_install_deps(self):
        installed = programs.install_deps_packages()
        stray = {name: package for name, (_, package) in programs.listed().items()
                 if package not in (programs.MINBASE, programs.MACHINE) and package not in installed}
        self.assertEqual(stray, {}, "listed with a package scripts/install-deps does not install")

    def test_install_deps_names_the_packages_known_to_be_needed(self):
        # A positive control for the parser: packages the suite cannot do without.
        installed = programs.install_deps_packages()
        for package in ("libvirt-daemon", "qemu-system-x86", "frr", "nftables", "linux-perf"):
            self.assertIn(package, installed)


class TheScanner(unittest.TestCase):
    """`called` on a made-up tree, with made-up programs on its PATH: it
    finds each way a program is named, and nothing else."""

    def setUp(self):
        self.root = tempfile.TemporaryDirectory()
        self.bin = tempfile.TemporaryDirectory()
        for name in ("frob", "zork", "quux", "plugh", "xyzzy", "grue", "thud", "wibble"):
            path = os.path.join(self.bin.name, name)
            with open(path, "w") as f:
                f.write("#!/bin/sh\n")
            os.chmod(path, stat.S_IRWXU)

    def tearDown(self):
        self.root.cleanup()
        self.bin.cleanup()

    def write(self, rel, text):
        path = os.path.join(self.root.name, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(textwrap.dedent(text))

    def called(self):
        return set(programs.called(self.root.name, path=self.bin.name))

    def test_rust_python_and_shell_calls_are_found(self):
        self.write("tests/integration/a.rs", 'fn t() { ns.cmd(&["frob", "-x"]); Command::new("zork"); }\n')
        self.write("bench/linnet_bench/b.py", 'run("quux", "--flag")\n')
        self.write("scripts/c", """\
            #!/usr/bin/env bash
            set -e
            x=$(plugh --list | sort) && xyzzy
            if true; then exec grue; fi
            """)
        self.assertEqual(self.called(), {"frob", "zork", "quux", "plugh", "xyzzy", "grue"})

    def test_text_for_elsewhere_is_not_a_call(self):
        self.write("scripts/d", """\
            #!/bin/sh
            echo "thud is not run here"
            cat > postinst <<'EOF'
            wibble --system
            EOF
            packages=(
                frob
            )
            """)
        self.write("src/e.rs", 'let key = info["zork"]; // a JSON field is a literal too\n')
        # Only "zork": a bare literal naming a program counts in Rust,
        # index or not; NOT_CALLED is how a word is let off.
        self.assertEqual(self.called(), {"zork"})

    def test_a_word_that_is_no_program_is_not_reported(self):
        self.write("src/f.rs", 'Command::new("not-on-this-path");\n')
        self.assertEqual(self.called(), set())


if __name__ == "__main__":
    unittest.main()

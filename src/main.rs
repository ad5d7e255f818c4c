//! `linnet`: the daemon and every command (src/cli/).

fn main() -> std::process::ExitCode {
    linnet::main()
}

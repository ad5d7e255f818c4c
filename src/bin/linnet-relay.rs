//! `linnet-relay`: the per-VM relay that `linnet helper` execs once it has
//! attached (src/cli/relay.rs). Not a command for people; see its --help.

fn main() -> std::process::ExitCode {
    linnet::relay_main()
}

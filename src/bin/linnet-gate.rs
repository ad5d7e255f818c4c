//! `linnet-gate`: the confined process that judges the connections of VMs
//! whose policy names DNS names by the name they show (src/gate/). The
//! daemon starts it; not a command for people.

fn main() -> std::process::ExitCode {
    linnet::gate_main()
}

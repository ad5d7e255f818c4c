//! linnet: networks for virtual machines on Linux.

mod addr6;
mod api;
mod budget;
mod cli;
mod coexist;
mod config;
mod daemon;
mod datapath;
mod files;
mod forward;
mod host;
mod policy;
mod services;
mod types;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let args = match cli::Cli::try_parse() {
        Ok(args) => args,
        // Usage errors exit 125 too, so they are never mistaken for CMD's status.
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() {
                cli::EXIT_LINNET_FAILED
            } else {
                0
            });
        }
    };
    cli::init_logging(&args);
    match cli::dispatch(args) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("linnet: {e:#}");
            ExitCode::from(cli::EXIT_LINNET_FAILED)
        }
    }
}

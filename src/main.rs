//! linnet: networks for virtual machines on Linux.

mod api;
mod cli;
mod config;
mod daemon;
mod host;
mod services;
mod types;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let args = cli::Cli::parse();
    cli::init_logging(&args);
    match cli::dispatch(args) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("linnet: {e:#}");
            ExitCode::from(cli::EXIT_LINNET_FAILED)
        }
    }
}

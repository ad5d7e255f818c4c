//! linnet-gendocs: writes linnet's man pages (linnet(8), linnet-run(8),
//! …, one per subcommand) and its bash, zsh and fish completions, all from
//! the command-line definition itself, so they never disagree with
//! `--help`.
//!
//!     linnet-gendocs OUT_DIR
//!
//! writes OUT_DIR/man/*.8 and OUT_DIR/completions/{linnet.bash,_linnet,linnet.fish}.

use std::path::Path;
use std::process::ExitCode;

use clap_complete::Shell;

/// Section 8: system administration commands (the daemon, and the
/// commands that drive it).
const SECTION: &str = "8";

fn main() -> ExitCode {
    let Some(out) = std::env::args_os().nth(1) else {
        eprintln!("usage: linnet-gendocs OUT_DIR");
        return ExitCode::from(2);
    };
    match write_all(Path::new(&out)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("linnet-gendocs: {e}");
            ExitCode::FAILURE
        }
    }
}

fn write_all(out: &Path) -> std::io::Result<()> {
    let man = out.join("man");
    std::fs::create_dir_all(&man)?;
    let command = linnet::command().version(env!("CARGO_PKG_VERSION"));
    man_pages(&command, "linnet", &man)?;
    let completions = out.join("completions");
    std::fs::create_dir_all(&completions)?;
    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        let mut cmd = command.clone();
        clap_complete::generate_to(shell, &mut cmd, "linnet", &completions)?;
    }
    Ok(())
}

/// `name`'s page, then one per subcommand (`linnet-run`), recursively.
fn man_pages(cmd: &clap::Command, name: &str, dir: &Path) -> std::io::Result<()> {
    // A tool that runs once: the names may live as long as it does.
    let title: &'static str = Box::leak(name.to_string().into_boxed_str());
    let page = cmd.clone().name(title).display_name(title);
    let mut text = Vec::new();
    clap_mangen::Man::new(page)
        .section(SECTION)
        .render(&mut text)?;
    std::fs::write(dir.join(format!("{name}.{SECTION}")), text)?;
    for sub in cmd
        .get_subcommands()
        .filter(|s| !s.is_hide_set() && s.get_name() != "help")
    {
        man_pages(sub, &format!("{name}-{}", sub.get_name()), dir)?;
    }
    Ok(())
}

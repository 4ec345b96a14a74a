//! `idempost-docgen`: writes `docs/configuration.md` from the services' clap definitions, or with
//! `--check` only says whether the committed page is current (exit 1 when it is stale).

use std::process::ExitCode;

fn main() -> ExitCode {
    let check = match std::env::args().nth(1).as_deref() {
        None => false,
        Some("--check") => true,
        Some(other) => {
            eprintln!("idempost-docgen: unknown argument {other}; usage: idempost-docgen [--check]");
            return ExitCode::from(2);
        }
    };
    let path = idempost_docgen::configuration_page_path();
    let page = idempost_docgen::configuration_page();
    if check {
        return match std::fs::read_to_string(&path) {
            Ok(committed) if committed == page => ExitCode::SUCCESS,
            _ => {
                eprintln!("{} is stale: run `{}`", path.display(), idempost_docgen::REGENERATE);
                ExitCode::FAILURE
            }
        };
    }
    match std::fs::write(&path, page) {
        Ok(()) => {
            println!("wrote {}", path.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("idempost-docgen: cannot write {}: {e}", path.display());
            ExitCode::FAILURE
        }
    }
}

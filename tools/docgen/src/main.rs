//! `idempost-docgen`: writes the generated parts of the documentation (`docs/configuration.md`
//! from the services' clap definitions; the figure table in `README.md` and
//! `docs/benchmarks/README.md` from `docs/benchmarks/current.json`), or with `--check` only says
//! whether the committed pages are current (exit 1 when one is stale).

use std::path::PathBuf;
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
    let mut pages: Vec<(PathBuf, String)> =
        vec![(idempost_docgen::configuration_page_path(), idempost_docgen::configuration_page())];
    match idempost_docgen::figures::pages(&idempost_docgen::workspace_root()) {
        Ok(figures) => pages.extend(figures),
        Err(e) => {
            eprintln!("idempost-docgen: the figure table: {e}");
            return ExitCode::FAILURE;
        }
    }
    let mut status = ExitCode::SUCCESS;
    for (path, page) in pages {
        let current = std::fs::read_to_string(&path).is_ok_and(|committed| committed == page);
        if check {
            if !current {
                eprintln!("{} is stale: run `{}`", path.display(), idempost_docgen::REGENERATE);
                status = ExitCode::FAILURE;
            }
        } else if current {
            println!("unchanged {}", path.display());
        } else if let Err(e) = std::fs::write(&path, page) {
            eprintln!("idempost-docgen: cannot write {}: {e}", path.display());
            status = ExitCode::FAILURE;
        } else {
            println!("wrote {}", path.display());
        }
    }
    status
}

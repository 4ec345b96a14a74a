//! `idempostctl`: the operators' command line over the order service's AdminService and the
//! consumer's ConsumerAdminService; tables for people, `--json` for scripts.

mod command;
mod console;
mod join;
mod render;
mod replay;
mod wait;

use std::process::ExitCode;

use clap::Parser as _;

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = command::Cli::parse();
    match command::run(&cli).await {
        Ok(output) => {
            if !output.is_empty() {
                println!("{output}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("idempostctl: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

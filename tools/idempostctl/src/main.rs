//! `idempostctl`: the operators' command line over the order service's AdminService and the
//! consumer's ConsumerAdminService; tables for people, `--json` for scripts.

mod audit;
mod command;
mod console;
mod join;
mod render;
mod replay;
mod shown;
mod wait;

use std::process::ExitCode;

use clap::Parser as _;

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = command::Cli::parse();
    match command::run(&cli).await {
        Ok(output) => {
            if !output.is_empty() {
                println!("{}", shown::terminal_safe(&output));
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("idempostctl: {}", shown::terminal_safe(&e.to_string()));
            ExitCode::from(e.exit_code())
        }
    }
}

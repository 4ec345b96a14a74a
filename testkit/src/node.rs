//! The TypeScript client's own tests (clients/typescript/test), run by node's test runner as a
//! subprocess against services a Rust test started: the TypeScript client's suite and any other
//! file that drives it use this one runner.

use std::path::PathBuf;
use std::time::Duration;

/// Longer than the harness's `WAIT`: a node test runs a Node toolchain and may wait on runs of
/// thousands of events, which take that long on a loaded two-core machine.
pub const SLOW_WAIT: Duration = Duration::from_secs(120);

/// clients/typescript (or `IDEMPOST_TS_CLIENT`), with its packages installed.
pub fn client_dir() -> PathBuf {
    let dir = std::env::var_os("IDEMPOST_TS_CLIENT")
        .map_or_else(|| crate::repo_root().join("clients/typescript"), PathBuf::from);
    assert!(
        dir.join("node_modules/.bin/tsx").exists(),
        "{} has no node_modules: scripts/test installs them (ensure_typescript_client in \
         scripts/common.sh; by hand: npm ci in clients/typescript)",
        dir.display()
    );
    dir
}

/// Runs `node --test` on one test file of clients/typescript with `vars` in its environment,
/// and fails (showing its report) unless every test in it ran and passed.
pub async fn node_test(file: &str, vars: &[(&str, String)]) {
    let mut command = tokio::process::Command::new("node");
    command
        .current_dir(client_dir())
        .args(["--import", "tsx", "--test", "--test-reporter=spec", file])
        .envs(vars.iter().map(|(name, value)| (*name, value.as_str())))
        .env_remove("IDEMPOST_TOKEN")
        .kill_on_drop(true);
    let output = tokio::time::timeout(SLOW_WAIT, command.output())
        .await
        .unwrap_or_else(|_| panic!("node --test {file} did not finish within {SLOW_WAIT:?}"))
        .unwrap_or_else(|e| panic!("cannot run node (Node 20 or later on PATH): {e}"));
    let report =
        format!("{}\n{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "node --test {file}: {}\n{report}", output.status);
    let count = |label: &str| {
        report
            .lines()
            .find_map(|line| line.trim_start_matches(['ℹ', '#', ' ']).strip_prefix(label))
            .and_then(|n| n.trim().parse::<u32>().ok())
    };
    assert!(count("pass ").is_some_and(|n| n > 0), "no test of {file} passed:\n{report}");
    assert_eq!((count("fail "), count("skipped ")), (Some(0), Some(0)), "{report}");
}

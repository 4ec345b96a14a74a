//! `idempost-migrate` takes its database URL from a file, as the services do, so a deployment can
//! mount it from a secret: the real binary against a fresh SQLite database.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::{Command, Output};

fn migrate(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_idempost-migrate"))
        .args(args)
        .env_clear()
        .envs(env.iter().copied())
        .current_dir(dir)
        .output()
        .unwrap()
}

fn text(output: &Output) -> String {
    format!("{}\n{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

#[test]
fn the_url_from_a_file_named_by_the_environment_migrates_and_a_second_run_finds_nothing_pending() {
    let dir = tempfile::tempdir().unwrap();
    let database = dir.path().join("idempost.db");
    let url_file = dir.path().join("url");
    std::fs::write(&url_file, format!("sqlite://{}?mode=rwc\n", database.display())).unwrap();
    let env = [("IDEMPOST_DATABASE_URL_FILE", url_file.to_str().unwrap())];

    let up = migrate(dir.path(), &["up"], &env);
    assert!(up.status.success(), "{}", text(&up));
    assert!(database.exists(), "{}", text(&up));
    let status = migrate(dir.path(), &["status"], &env);
    assert!(status.status.success(), "{}", text(&status));
    assert!(text(&status).contains("Applied"), "{}", text(&status));
    assert!(!text(&status).contains("Pending"), "{}", text(&status));
}

#[test]
fn the_flag_form_works_and_a_file_with_a_url_too_is_refused_without_showing_either() {
    let dir = tempfile::tempdir().unwrap();
    let database = dir.path().join("idempost.db");
    let url_file = dir.path().join("url");
    std::fs::write(&url_file, format!("sqlite://{}?mode=rwc", database.display())).unwrap();
    let file = url_file.to_str().unwrap();

    let up = migrate(dir.path(), &["--database-url-file", file, "up"], &[]);
    assert!(up.status.success(), "{}", text(&up));

    let secret = "sqlite://s3cret-password@nowhere";
    let both =
        migrate(dir.path(), &["up"], &[("IDEMPOST_DATABASE_URL_FILE", file), ("DATABASE_URL", secret)]);
    assert_eq!(both.status.code(), Some(2), "{}", text(&both));
    assert!(text(&both).contains("--database-url-file"), "{}", text(&both));
    assert!(
        !text(&both).contains("s3cret") && !text(&both).contains(&*database.to_string_lossy()),
        "{}",
        text(&both)
    );
}

#[test]
fn no_url_at_all_and_an_empty_or_missing_file_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let none = migrate(dir.path(), &["up"], &[]);
    assert_eq!(none.status.code(), Some(2), "{}", text(&none));
    assert!(text(&none).contains("IDEMPOST_DATABASE_URL_FILE"), "{}", text(&none));

    let empty = dir.path().join("empty");
    std::fs::write(&empty, "\n").unwrap();
    let refused = migrate(dir.path(), &["up"], &[("IDEMPOST_DATABASE_URL_FILE", empty.to_str().unwrap())]);
    assert_eq!(refused.status.code(), Some(2), "{}", text(&refused));
    assert!(text(&refused).contains("is empty"), "{}", text(&refused));

    let missing = dir.path().join("missing");
    let refused = migrate(dir.path(), &["up"], &[("IDEMPOST_DATABASE_URL_FILE", missing.to_str().unwrap())]);
    assert_eq!(refused.status.code(), Some(2), "{}", text(&refused));
    assert!(text(&refused).contains("cannot read"), "{}", text(&refused));
}

#[test]
fn help_names_the_file_setting_and_its_environment_variable() {
    let dir = tempfile::tempdir().unwrap();
    let help = migrate(dir.path(), &["--help"], &[]);
    assert!(help.status.success(), "{}", text(&help));
    assert!(
        text(&help).contains("--database-url-file")
            && text(&help).contains("[env: IDEMPOST_DATABASE_URL_FILE")
    );
}

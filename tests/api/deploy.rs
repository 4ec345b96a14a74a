//! The deployment files (deploy/) without a container runtime: every Kubernetes manifest (the
//! KEDA ScaledObject included) and the Compose file validate against their schemas, every flag,
//! subcommand and environment variable they hand a binary exists in that binary's `--help`, so
//! they cannot drift from the code, and the Prometheus alert rules pass `promtool check rules`
//! and their `promtool test rules` fixtures. Builds nothing: the binaries are the ones next to
//! the test executable. (The dashboard's and the rules' metric names are compared with a live
//! scrape in metrics_scrape.rs.) The security rules of deploy/hardening.py hold: secret files
//! readable by the pod's group only, database URLs and Kafka credentials as mounted files, Kafka
//! over SASL_SSL with ACLs that let only the relay write, egress and ingress bounded, no `:latest`
//! image, secrets kept out of the build context and git.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

use crate::helpers::service_binary;

/// Settings read outside clap (so absent from `--help`): they must be read by the telemetry.
const TELEMETRY: &str = include_str!("../../src/telemetry.rs");

fn deploy_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("deploy")
}

/// `deploy/check.py <command>` run by the venv with deploy/requirements.txt: its stdout.
fn check(command: &str) -> String {
    let python = std::env::var("IDEMPOST_DEPLOY_PYTHON").unwrap_or_else(|_| {
        panic!(
            "IDEMPOST_DEPLOY_PYTHON is not set: scripts/test sets it (ensure_deploy_checks in \
             scripts/common.sh); after one run: export IDEMPOST_DEPLOY_PYTHON=$HOME/.cache/idempost/deploy-venv/bin/python"
        )
    });
    let output = Command::new(&python).arg(deploy_dir().join("check.py")).arg(command).output().unwrap();
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert!(
        output.status.success(),
        "check.py {command}: {}\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

#[test]
fn every_kubernetes_manifest_and_the_compose_file_validate_against_their_schemas() {
    let report = check("validate");

    for kind in [
        "Job/",
        "Deployment/",
        "StatefulSet/",
        "Service/",
        "PodDisruptionBudget/",
        "NetworkPolicy/",
        "ScaledObject/",
    ] {
        assert!(report.contains(&format!(": {kind}")), "no {kind} was validated:\n{report}");
    }
    assert!(report.contains("valid   compose.yaml"), "{report}");
}

/// Whether `help` names `word` as a whole word right after `prefix`.
fn names(help: &str, prefix: &str, word: &str) -> bool {
    let needle = format!("{prefix}{word}");
    help.match_indices(&needle).any(|(at, _)| {
        help[at + needle.len()..]
            .chars()
            .next()
            .is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '-' || c == '_'))
    })
}

#[test]
fn every_flag_and_environment_variable_the_deployment_files_pass_exists_in_the_binaries_help() {
    let starts: Vec<Value> = serde_json::from_str(&check("inventory")).unwrap();
    assert!(starts.len() >= 8, "every manifest, compose service and image target: {starts:?}");
    let mut unknown = Vec::new();
    for start in &starts {
        let (source, binary) = (start["source"].as_str().unwrap(), start["binary"].as_str().unwrap());
        let output = Command::new(service_binary(binary)).arg("--help").env_clear().output().unwrap();
        assert!(output.status.success(), "{binary} --help failed");
        let help = String::from_utf8(output.stdout).unwrap();
        let list = |key: &str| start[key].as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_owned());
        for flag in list("flags") {
            if !names(&help, "--", &flag) {
                unknown.push(format!("{source}: {binary} has no flag --{flag}"));
            }
        }
        for word in list("words") {
            if !help
                .lines()
                .any(|line| names(line.trim_start(), "", &word) && line.trim_start().starts_with(&word))
            {
                unknown.push(format!("{source}: {binary} has no subcommand {word}"));
            }
        }
        for var in list("env") {
            let known = names(&help, "[env: ", &var) || names(&help, "env: ", &var);
            let telemetry =
                (var.starts_with("OTEL_") || var == "IDEMPOST_LOG_FORMAT") && TELEMETRY.contains(&var);
            if !known && !telemetry {
                unknown.push(format!("{source}: {binary} reads no {var}"));
            }
        }
    }
    assert!(unknown.is_empty(), "the deployment files drifted from the binaries:\n{}", unknown.join("\n"));
}

/// `promtool ARGS` in deploy/prometheus: its stdout, after asserting it succeeded. promtool comes
/// from Debian's `prometheus` package (scripts/common.sh ensure_promtool).
fn promtool(args: &[&str]) -> String {
    let output = Command::new("promtool")
        .args(args)
        .current_dir(deploy_dir().join("prometheus"))
        .output()
        .unwrap_or_else(|e| panic!("promtool cannot run ({e}): scripts/test installs it (ensure_promtool)"));
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert!(
        output.status.success(),
        "promtool {args:?}: {}\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

#[test]
fn the_alert_rules_pass_promtool_check_rules_and_their_promtool_test_fixtures() {
    let checked = promtool(&["check", "rules", "alerts.yaml"]);
    // Every rule of the file is read: as many as it has `alert:` entries.
    let rules = std::fs::read_to_string(deploy_dir().join("prometheus/alerts.yaml")).unwrap();
    let alerts = rules.lines().filter(|line| line.trim_start().starts_with("- alert:")).count();
    assert!(checked.contains(&format!("SUCCESS: {alerts} rules found")), "{checked}");
    let tested = promtool(&["test", "rules", "alerts.test.yaml"]);
    assert!(tested.contains("SUCCESS"), "{tested}");
}

/// Asserts that each of `rules` of `check.py hardening` checked something and found nothing.
fn assert_hardened(rules: &[&str]) {
    let report: Value = serde_json::from_str(&check("hardening")).unwrap();
    for rule in rules {
        let result = &report[*rule];
        let problems: Vec<_> =
            result["problems"].as_array().unwrap().iter().map(|p| p.as_str().unwrap()).collect();
        assert!(problems.is_empty(), "hardening rule {rule}:\n{}", problems.join("\n"));
        assert!(result["checked"].as_u64().unwrap() > 0, "hardening rule {rule} checked nothing: {result}");
    }
}

#[test]
fn secret_files_are_readable_by_the_pods_group_only_and_database_urls_are_files_not_environment_variables() {
    assert_hardened(&["secret-volumes", "database-url-files"]);
}

#[test]
fn no_image_is_latest_or_untagged_and_secrets_stay_out_of_the_build_context_and_git() {
    assert_hardened(&["images", "ignore-files"]);
}

#[test]
fn the_relay_and_the_consumer_reach_kafka_over_sasl_ssl_as_themselves_and_only_the_relay_may_write() {
    assert_hardened(&["kafka"]);
}

#[test]
fn egress_is_denied_but_for_dns_the_database_the_broker_and_the_collector() {
    assert_hardened(&["egress"]);
}

#[test]
fn callers_and_operators_are_admitted_only_from_namespaces_labelled_as_clients() {
    assert_hardened(&["ingress-namespaces"]);
}

//! The documentation has one index (docs/README.md) that lists every page of docs/, the README
//! points at it, and no relative link of README.md or docs/**/*.md leads nowhere.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use idempost_docgen::links::{self, HISTORY_INDEX, INDEX};
use idempost_docgen::workspace_root;

#[test]
fn every_page_in_docs_is_listed_in_the_docs_index() {
    let missing = links::unindexed(&workspace_root()).unwrap();
    assert!(
        missing.is_empty(),
        "pages of docs/ that {INDEX} does not list (a dated benchmark report goes in {HISTORY_INDEX}):\n{}",
        missing.iter().map(|p| format!("  {}", p.display())).collect::<Vec<_>>().join("\n")
    );
}

#[test]
fn the_readme_links_to_the_docs_index() {
    let listed = links::listed(&workspace_root(), Path::new("README.md")).unwrap();
    assert!(listed.contains(Path::new(INDEX)), "README.md does not link to {INDEX}");
}

#[test]
fn no_relative_link_in_the_readme_or_the_docs_is_broken() {
    let broken = links::broken(&workspace_root()).unwrap();
    assert!(broken.is_empty(), "broken links:\n  {}", broken.join("\n  "));
}

#[test]
fn the_history_index_says_which_commit_each_report_measured() {
    let root = workspace_root();
    let text = std::fs::read_to_string(root.join(HISTORY_INDEX)).unwrap();
    let reports = links::listed(&root, Path::new(HISTORY_INDEX)).unwrap();
    let history = Path::new(HISTORY_INDEX).parent().unwrap();
    let on_disk: Vec<PathBuf> = links::pages(&root)
        .unwrap()
        .into_iter()
        .filter(|page| page.parent() == Some(history) && page.as_path() != Path::new(HISTORY_INDEX))
        .collect();
    assert!(!on_disk.is_empty(), "no reports under {}", history.display());
    for report in on_disk {
        assert!(reports.contains(&report), "{HISTORY_INDEX} does not list {}", report.display());
        let name = report.file_name().unwrap().to_string_lossy().into_owned();
        let row = text
            .lines()
            .find(|line| line.starts_with(&format!("| [{name}]")))
            .unwrap_or_else(|| panic!("{HISTORY_INDEX} has no table row for {name}"));
        let commit = row.split('|').nth(2).unwrap_or_default();
        let names_one = commit.contains("not stated")
            || commit.split(|c: char| !c.is_ascii_hexdigit()).any(|word| word.len() >= 7);
        assert!(names_one, "{name}'s row names no commit (or \"not stated\"): {row}");
    }
}

/// A small docs tree in a directory of its own, removed when dropped.
struct Tree(PathBuf);

impl Tree {
    fn new(name: &str, files: &[(&str, &str)]) -> Self {
        let root = std::env::temp_dir().join(format!("idempost-docgen-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for (path, text) in files {
            let path = root.join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        Self(root)
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn a_missing_file_a_missing_heading_and_an_unlisted_page_are_found() {
    let tree = Tree::new(
        "broken",
        &[
            ("README.md", "See [the docs](docs/README.md) and [gone](docs/gone.md).\n"),
            (
                "docs/README.md",
                "# Docs\n\n| page |\n|---|\n| [a](a.md) |\n| [history](benchmarks/history/README.md) |\n",
            ),
            (
                "docs/a.md",
                "# A page\n\n## The database's redo log\n\n[ok](#the-databases-redo-log), [bad](#no-such), \
                 [up](../README.md#nothing), `[code](nowhere.md)`, [web](https://example.invalid/x.md)\n\n\
                 ```\n[fenced](nowhere.md)\n```\n",
            ),
            ("docs/b.md", "# Not listed\n"),
            ("docs/benchmarks/history/README.md", "[one](2026-01-01.md)\n"),
            ("docs/benchmarks/history/2026-01-01.md", "[back](../../a.md#a-page)\n"),
            ("docs/benchmarks/history/2026-01-02.md", "# Not in the history index\n"),
        ],
    );
    let broken = links::broken(&tree.0).unwrap();
    assert_eq!(
        broken,
        [
            "README.md:1: docs/gone.md: docs/gone.md does not exist",
            "docs/a.md:5: #no-such: docs/a.md has no heading #no-such",
            "docs/a.md:5: ../README.md#nothing: README.md has no heading #nothing",
        ],
    );
    let unindexed = links::unindexed(&tree.0).unwrap();
    assert_eq!(
        unindexed,
        [PathBuf::from("docs/b.md"), PathBuf::from("docs/benchmarks/history/2026-01-02.md")]
    );
}

#[test]
fn headings_get_the_anchors_github_gives_them() {
    assert_eq!(links::slug("The database's redo log"), "the-databases-redo-log");
    assert_eq!(links::slug("Upgrading to amend and cancel"), "upgrading-to-amend-and-cancel");
    assert_eq!(links::slug("linger.ms = 1"), "lingerms--1");
    let anchors = links::anchors("# `idempostctl console`\n\n## Runs\n\n## Runs\n\nSetext\n---\n");
    assert_eq!(anchors.into_iter().collect::<Vec<_>>(), ["idempostctl-console", "runs", "runs-1", "setext"]);
}

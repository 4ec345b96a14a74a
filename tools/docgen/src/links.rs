//! The documentation's own checks: every page of `docs/` is reachable from the one index
//! (`docs/README.md`; the dated benchmark reports through `docs/benchmarks/history/README.md`,
//! which the index lists), and no relative link of `README.md` or `docs/**/*.md` points at a
//! file, or a heading of a page, that does not exist. Links with a scheme (`https:`, `mailto:`)
//! are not followed.

use std::collections::{BTreeSet, HashMap};
use std::path::{Component, Path, PathBuf};

use pulldown_cmark::{Event, Options, Parser, Tag, TagEnd};

/// The one docs index, relative to the workspace root.
pub const INDEX: &str = "docs/README.md";

/// The index of the dated benchmark reports, itself listed in [`INDEX`].
pub const HISTORY_INDEX: &str = "docs/benchmarks/history/README.md";

/// One link as written: the page it is on (relative to the root), its line, its destination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    pub page: PathBuf,
    pub line: usize,
    pub destination: String,
}

fn parser(text: &str) -> Parser<'_> {
    Parser::new_ext(text, Options::ENABLE_TABLES | Options::ENABLE_STRIKETHROUGH)
}

/// The destinations of every link and image in `text`, with the line each starts on; code
/// spans and code blocks hold none.
pub fn destinations(text: &str) -> Vec<(usize, String)> {
    parser(text)
        .into_offset_iter()
        .filter_map(|(event, range)| match event {
            Event::Start(Tag::Link { dest_url, .. } | Tag::Image { dest_url, .. }) => {
                Some((text[..range.start].matches('\n').count() + 1, dest_url.into_string()))
            }
            _ => None,
        })
        .collect()
}

/// The anchors GitHub gives the headings of `text`: the heading's text in lower case, without
/// punctuation but `-` and `_`, spaces as `-`; a repeated one gets `-1`, `-2`, ...
pub fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut out = BTreeSet::new();
    let mut heading: Option<String> = None;
    for event in parser(text) {
        match event {
            Event::Start(Tag::Heading { id, .. }) => {
                if let Some(id) = id {
                    out.insert(id.into_string());
                }
                heading = Some(String::new());
            }
            Event::Text(t) | Event::Code(t) => {
                if let Some(h) = heading.as_mut() {
                    h.push_str(&t);
                }
            }
            Event::End(TagEnd::Heading(_)) => {
                if let Some(h) = heading.take() {
                    let slug = slug(&h);
                    let n = seen.entry(slug.clone()).or_insert(0);
                    out.insert(if *n == 0 { slug.clone() } else { format!("{slug}-{n}") });
                    *n += 1;
                }
            }
            _ => {}
        }
    }
    out
}

/// A heading's anchor as GitHub makes it.
pub fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// Whether `destination` leaves the repository (a scheme such as `https:` or `mailto:`).
fn is_external(destination: &str) -> bool {
    destination.split_once(':').is_some_and(|(scheme, _)| {
        !scheme.is_empty()
            && scheme.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
    })
}

/// The pages checked: `README.md` and every `.md` under `docs/`, relative to `root`, sorted.
pub fn pages(root: &Path) -> Result<Vec<PathBuf>, String> {
    let mut out = vec![PathBuf::from("README.md")];
    let mut dirs = vec![PathBuf::from("docs")];
    while let Some(dir) = dirs.pop() {
        let entries =
            std::fs::read_dir(root.join(&dir)).map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
        for entry in entries {
            let entry = entry.map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
            let path = dir.join(entry.file_name());
            let kind = entry.file_type().map_err(|e| format!("{}: {e}", path.display()))?;
            if kind.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|ext| ext == "md") {
                out.push(path);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// `path` without `.` and with each `..` taken back; `None` when it climbs out of the root.
fn normalised(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            Component::Normal(name) => out.push(name),
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(out)
}

/// Where a relative `destination` on `page` leads, relative to the root (the page itself for
/// `#anchor` alone), and its anchor; `None` for an external link or one that leaves the root.
pub fn resolve(page: &Path, destination: &str) -> Option<(PathBuf, Option<String>)> {
    if is_external(destination) {
        return None;
    }
    let (path, anchor) = match destination.split_once('#') {
        Some((path, anchor)) => (path, Some(anchor.to_owned())),
        None => (destination, None),
    };
    let target = if path.is_empty() {
        page.to_path_buf()
    } else if let Some(from_root) = path.strip_prefix('/') {
        PathBuf::from(from_root)
    } else {
        page.parent().unwrap_or(Path::new("")).join(path)
    };
    Some((normalised(&target)?, anchor))
}

/// Every relative link of the checked pages under `root` that leads nowhere: a file or
/// directory that does not exist, or a `#heading` that a Markdown page does not have. One line
/// each, `page:line: destination: why`.
pub fn broken(root: &Path) -> Result<Vec<String>, String> {
    let mut anchors_of: HashMap<PathBuf, BTreeSet<String>> = HashMap::new();
    let mut out = Vec::new();
    for page in pages(root)? {
        let text = read(root, &page)?;
        for (line, destination) in destinations(&text) {
            let at = format!("{}:{line}: {destination}", page.display());
            if is_external(&destination) {
                continue;
            }
            let Some((target, anchor)) = resolve(&page, &destination) else {
                out.push(format!("{at}: leads out of the repository"));
                continue;
            };
            if !root.join(&target).exists() {
                out.push(format!("{at}: {} does not exist", target.display()));
                continue;
            }
            let Some(anchor) = anchor.filter(|a| !a.is_empty()) else { continue };
            if target.extension().is_none_or(|ext| ext != "md") {
                continue;
            }
            if !anchors_of.contains_key(&target) {
                anchors_of.insert(target.clone(), anchors(&read(root, &target)?));
            }
            if anchors_of.get(&target).is_none_or(|known| !known.contains(&anchor)) {
                out.push(format!("{at}: {} has no heading #{anchor}", target.display()));
            }
        }
    }
    Ok(out)
}

/// The pages `index` (relative to the root) links to, relative to the root, anchors dropped; a
/// link to a directory lists its `README.md`.
pub fn listed(root: &Path, index: &Path) -> Result<BTreeSet<PathBuf>, String> {
    Ok(destinations(&read(root, index)?)
        .into_iter()
        .filter_map(|(_, destination)| resolve(index, &destination))
        .map(|(target, _)| if root.join(&target).is_dir() { target.join("README.md") } else { target })
        .collect())
}

/// Every `.md` page under `docs/` that the index does not list (the dated benchmark reports
/// count when the history index lists them and the index lists the history index).
pub fn unindexed(root: &Path) -> Result<Vec<PathBuf>, String> {
    let mut indexed = listed(root, Path::new(INDEX))?;
    if indexed.contains(Path::new(HISTORY_INDEX)) {
        indexed.extend(listed(root, Path::new(HISTORY_INDEX))?);
    }
    Ok(pages(root)?
        .into_iter()
        .filter(|page| page.starts_with("docs") && page != Path::new(INDEX) && !indexed.contains(page))
        .collect())
}

fn read(root: &Path, page: &Path) -> Result<String, String> {
    std::fs::read_to_string(root.join(page)).map_err(|e| format!("cannot read {}: {e}", page.display()))
}

//! The workspace's structural invariants, checked against the manifests and ARCHITECTURE.md:
//! every crate is in the code map, a crate depends only on crates listed above it there
//! (dependencies point one way), and only the binary crate knows clap.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The crate names of ARCHITECTURE.md's code map, in their order there.
fn code_map_order(architecture: &str) -> Vec<String> {
    let mut names = Vec::new();
    for line in architecture.lines() {
        let Some(rest) = line.strip_prefix("- `crates/") else { continue };
        let Some(name) = rest.split('`').next() else { continue };
        let name = name.trim_end_matches('/').to_string();
        if !name.is_empty() && !names.contains(&name) {
            names.push(name);
        }
    }
    names
}

/// The names under `[dependencies]` of a Cargo manifest (dev- and build-dependencies left out).
fn normal_dependencies(manifest: &str) -> Vec<String> {
    let mut deps = Vec::new();
    let mut inside = false;
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            inside = line == "[dependencies]";
            continue;
        }
        if inside && !line.is_empty() && !line.starts_with('#') {
            let name = line.split(['=', '.', ' ']).next().unwrap_or("").trim();
            if !name.is_empty() {
                deps.push(name.to_string());
            }
        }
    }
    deps
}

/// Every crate directory under crates/ with its manifest's text.
fn crate_manifests() -> BTreeMap<String, String> {
    let dir = workspace_root().join("crates");
    let mut manifests = BTreeMap::new();
    for entry in std::fs::read_dir(&dir).expect("reading crates/") {
        let path = entry.expect("a crates/ entry").path();
        let manifest = path.join("Cargo.toml");
        if manifest.is_file() {
            let name = path.file_name().expect("a directory name").to_string_lossy().into_owned();
            manifests.insert(name, std::fs::read_to_string(&manifest).expect("reading a manifest"));
        }
    }
    manifests
}

fn architecture() -> String {
    std::fs::read_to_string(workspace_root().join("ARCHITECTURE.md")).expect("reading ARCHITECTURE.md")
}

#[test]
fn every_crate_is_in_the_code_map() {
    let order = code_map_order(&architecture());
    let manifests = crate_manifests();
    let missing: Vec<&String> = manifests.keys().filter(|c| !order.contains(c)).collect();
    assert!(missing.is_empty(), "crates missing from ARCHITECTURE.md's code map: {missing:?}");
    let stale: Vec<&String> = order.iter().filter(|c| !manifests.contains_key(*c)).collect();
    assert!(stale.is_empty(), "code map names crates that do not exist: {stale:?}");
}

#[test]
fn dependencies_point_up_the_code_map_only() {
    let order = code_map_order(&architecture());
    let rank = |name: &str| order.iter().position(|c| c == name);
    let mut wrong = Vec::new();
    for (name, manifest) in crate_manifests() {
        let Some(own) = rank(&name) else { continue };
        for dep in normal_dependencies(&manifest).iter().filter(|d| d.starts_with("kforge")) {
            match rank(dep) {
                Some(r) if r < own => {}
                _ => wrong.push(format!("{name} -> {dep}")),
            }
        }
    }
    assert!(wrong.is_empty(), "dependencies on crates not listed above them in the code map: {wrong:?}");
}

#[test]
fn only_the_binary_knows_clap() {
    let offenders: Vec<String> = crate_manifests()
        .into_iter()
        .filter(|(name, manifest)| name != "kforge" && normal_dependencies(manifest).iter().any(|d| d == "clap"))
        .map(|(name, _)| name)
        .collect();
    assert!(offenders.is_empty(), "library crates depending on clap: {offenders:?}");
}

#[test]
fn the_manifest_reader_sees_only_normal_dependencies() {
    let manifest =
        "[package]\nname = \"x\"\n[dependencies]\nkforge-proto.workspace = true\nclap = { version = \"4\" }\n\
                    [dev-dependencies]\nkforge-store.workspace = true\n";
    assert_eq!(normal_dependencies(manifest), vec!["kforge-proto".to_string(), "clap".to_string()]);
    let doc =
        "- `crates/kforge-proto` — the wire\n  - `crates/nested` no\n- `crates/` — all\n- `crates/kforge` — bin\n";
    assert_eq!(code_map_order(doc), vec!["kforge-proto".to_string(), "kforge".to_string()]);
}

//! Embeds the pure-Python `kforge` package (every `*.py` and `py.typed` under python/kforge,
//! subpackages included) so that a carried release binary is self-contained.
use std::{
    env, fs,
    path::{Path, PathBuf},
};

/// Every embedded file under `dir`, as paths relative to `root`, sorted.
fn collect(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) {
    println!("cargo:rerun-if-changed={}", dir.display());
    let Ok(entries) = fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if path.is_dir() {
            if name != "__pycache__" && !name.starts_with('.') {
                collect(root, &path, out);
            }
        } else if name.ends_with(".py") || name == "py.typed" {
            out.push(path.strip_prefix(root).expect("under the package root").to_path_buf());
        }
    }
}

fn main() {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let root = manifest.join("../../python/kforge");
    let mut files = Vec::new();
    collect(&root, &root, &mut files);
    files.sort();
    let mut out = String::from("/// The embedded package: (path relative to `kforge/`, contents).\n");
    out.push_str("pub const PY_FILES: &[(&str, &str)] = &[\n");
    for rel in &files {
        let abs = fs::canonicalize(root.join(rel)).expect("embedded file exists");
        println!("cargo:rerun-if-changed={}", abs.display());
        let rel = rel.to_string_lossy().replace('\\', "/");
        out.push_str(&format!("    ({:?}, include_str!({:?})),\n", rel, abs.display().to_string()));
    }
    out.push_str("];\n");
    let dest = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("py_files.rs");
    fs::write(dest, out).expect("writing py_files.rs");
}

//! Embeds the pure-Python `kforge` package (python/kforge/*.py) into the daemon, which writes it
//! out at start and puts it on every job's PYTHONPATH: a carried release binary is self-contained.
use std::{env, fs, path::PathBuf};

fn main() {
    let root = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap()).join("../../python/kforge");
    println!("cargo:rerun-if-changed={}", root.display());
    let mut files: Vec<PathBuf> =
        fs::read_dir(&root).map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect()).unwrap_or_default();
    files.retain(|p| p.extension().map(|e| e == "py" || e == "typed").unwrap_or(false));
    files.sort();
    let mut out = String::from(
        "/// The embedded Python package: (file name, contents).\npub const PY_FILES: &[(&str, &str)] = &[\n",
    );
    for f in &files {
        println!("cargo:rerun-if-changed={}", f.display());
        let name = f.file_name().unwrap().to_string_lossy();
        let abs = fs::canonicalize(f).unwrap();
        out.push_str(&format!("    ({:?}, include_str!({:?})),\n", name, abs.display().to_string()));
    }
    out.push_str("];\n");
    fs::write(PathBuf::from(env::var("OUT_DIR").unwrap()).join("py_files.rs"), out).unwrap();
}

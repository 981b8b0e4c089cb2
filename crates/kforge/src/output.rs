//! What several commands share: writing a result to a file or standard output, and the embedded
//! Python package on a child's PYTHONPATH.

use anyhow::{Context, Result};

/// Write `body` to `dest`, or print it when `dest` is `-`.
pub fn write_out(dest: &str, body: &str) -> Result<()> {
    if dest == "-" {
        println!("{body}");
        Ok(())
    } else {
        std::fs::write(dest, body).with_context(|| format!("writing {dest}"))
    }
}

/// Print a command's table for people: on standard output, or on standard error when the JSON
/// report went to standard output (`--json -`), which then stays parseable.
pub fn print_table(json: Option<&str>, table: &str) {
    if json == Some("-") {
        eprint!("{table}");
    } else {
        print!("{table}");
    }
}

/// Put the embedded Python package first on `cmd`'s PYTHONPATH; the returned directory holds it
/// and must outlive the command.
pub fn embedded_python(cmd: &mut std::process::Command) -> Result<tempfile::TempDir> {
    let tmp = tempfile::tempdir().context("creating a temporary directory")?;
    kforge_python::write_package(tmp.path()).context("writing the embedded Python package")?;
    let pp = std::env::var_os("PYTHONPATH").map(|p| format!("{}:{}", tmp.path().display(), p.to_string_lossy()));
    cmd.env("PYTHONPATH", pp.unwrap_or_else(|| tmp.path().display().to_string()));
    Ok(tmp)
}

/// This binary's path (private daemons and the guardian are started from it).
pub fn this_binary() -> Result<std::path::PathBuf> {
    std::env::current_exe().context("locating the kforge binary")
}

//! The `kforge` Python package, embedded at build time (`build.rs` walks `python/kforge`,
//! subpackages included). The daemon writes it out for its jobs' PYTHONPATH; `kforge verify` and
//! `kforge inspect` write it out for the processes they start. Nothing here runs Python.
use std::path::{Path, PathBuf};

mod files {
    include!(concat!(env!("OUT_DIR"), "/py_files.rs"));
}
pub use files::PY_FILES;

/// Writing the package out failed.
#[derive(Debug, thiserror::Error)]
#[error("{what} {}: {source}", path.display())]
pub struct WriteError {
    pub what: &'static str,
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

/// Write the embedded package into `dir/kforge/` (for a PYTHONPATH entry `dir`), subpackage
/// directories included. Returns the package directory.
pub fn write_package(dir: &Path) -> Result<PathBuf, WriteError> {
    let pkg = dir.join("kforge");
    for (rel, body) in PY_FILES {
        let path = pkg.join(rel);
        let parent = path.parent().unwrap_or(&pkg);
        std::fs::create_dir_all(parent).map_err(|source| WriteError {
            what: "creating",
            path: parent.to_path_buf(),
            source,
        })?;
        std::fs::write(&path, body).map_err(|source| WriteError { what: "writing", path: path.clone(), source })?;
    }
    Ok(pkg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_package_root_and_client_are_embedded() {
        let names: Vec<&str> = PY_FILES.iter().map(|(n, _)| *n).collect();
        assert!(names.contains(&"__init__.py"), "{names:?}");
        assert!(names.contains(&"py.typed"), "{names:?}");
        assert!(names.iter().all(|n| !n.contains("__pycache__")), "{names:?}");
    }

    #[test]
    fn write_package_reproduces_every_file() {
        let dir = tempfile::tempdir().unwrap();
        let pkg = write_package(dir.path()).unwrap();
        for (rel, body) in PY_FILES {
            let got = std::fs::read_to_string(pkg.join(rel)).unwrap();
            assert_eq!(&got, body, "{rel}");
        }
    }

    #[test]
    fn write_package_names_the_path_it_could_not_write() {
        let dir = tempfile::tempdir().unwrap();
        let blocker = dir.path().join("kforge");
        std::fs::write(&blocker, "a file where the package directory should be").unwrap();
        let err = write_package(dir.path()).unwrap_err();
        assert!(err.to_string().contains("kforge"), "{err}");
    }
}

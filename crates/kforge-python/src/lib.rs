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

/// The directory, inside the directory [`write_package`] wrote into, that holds the bootstrap of
/// `kforge run --auto-regions`: only a `sitecustomize.py` (its name is no Python identifier, so
/// the package's own PYTHONPATH entry cannot import it).
pub const AUTO_REGIONS_DIR: &str = "kforge-auto-regions";

/// The bootstrap's `sitecustomize.py`: chains to the environment's own `sitecustomize` and
/// installs the hooks of `kforge.autoregions` (which do nothing outside a kforge job).
pub const AUTO_REGIONS_SITECUSTOMIZE: &str = "\
# Written by the kforge daemon for `kforge run --auto-regions` (a PYTHONPATH entry of such jobs):
# runs the sitecustomize this one shadows, then installs kforge.autoregions' hooks.
import os as _os

from kforge.autoregions import bootstrap as _bootstrap

_bootstrap(_os.path.dirname(_os.path.abspath(__file__)))
";

/// The bootstrap directory of `kforge run --auto-regions` for a package written into `dir`.
pub fn auto_regions_dir(dir: &Path) -> PathBuf {
    dir.join(AUTO_REGIONS_DIR)
}

/// Write the `--auto-regions` bootstrap into [`auto_regions_dir`]`(dir)`; returns that directory.
pub fn write_auto_regions(dir: &Path) -> Result<PathBuf, WriteError> {
    let boot = auto_regions_dir(dir);
    std::fs::create_dir_all(&boot).map_err(|source| WriteError { what: "creating", path: boot.clone(), source })?;
    let file = boot.join("sitecustomize.py");
    std::fs::write(&file, AUTO_REGIONS_SITECUSTOMIZE).map_err(|source| WriteError {
        what: "writing",
        path: file,
        source,
    })?;
    Ok(boot)
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
    fn the_auto_regions_bootstrap_is_written_beside_the_package() {
        let dir = tempfile::tempdir().unwrap();
        write_package(dir.path()).unwrap();
        let boot = write_auto_regions(dir.path()).unwrap();
        assert_eq!(boot, dir.path().join(AUTO_REGIONS_DIR));
        let names: Vec<_> = std::fs::read_dir(&boot).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, ["sitecustomize.py"], "the bootstrap directory holds nothing else");
        let body = std::fs::read_to_string(boot.join("sitecustomize.py")).unwrap();
        assert!(body.contains("from kforge.autoregions import bootstrap"), "{body}");
        assert!(PY_FILES.iter().any(|(n, _)| *n == "autoregions.py"), "the module it imports is embedded");
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

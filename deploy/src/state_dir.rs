//! The state directory a launcher owns, and the marker that proves it.
//!
//! `docket-local up` starts afresh (old data would bring back an old cluster) and
//! `docket-local down --remove` deletes the directory. Both delete only a directory a Docket
//! launcher created: it writes [`MARKER`] into the directory when it creates it, and nothing
//! without that marker is emptied or removed. A mistyped `--state-dir` that names a home, a
//! project or a system directory is refused with the reason, never emptied; so is a symbolic
//! link (what it points to was not made here).

use std::io;
use std::path::Path;

use crate::LaunchError;

/// The file that marks a state directory as a launcher's own.
pub const MARKER: &str = ".docket-local";

const MARKER_TEXT: &str = "This directory was created by a Docket launcher (docket-local, \
docket-chaos). `docket-local down --remove` and the next `docket-local up` delete it whole.\n";

/// What a path is, as far as a launcher may touch it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ownership {
    /// Nothing there.
    Missing,
    /// An empty directory.
    Empty,
    /// A directory a launcher created (it holds the marker).
    Ours,
    /// Anything else: a directory without the marker, a file, a symbolic link.
    Foreign,
}

/// What `dir` is.
pub fn ownership(dir: &Path) -> Result<Ownership, LaunchError> {
    let meta = match std::fs::symlink_metadata(dir) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Ownership::Missing),
        Err(e) => return Err(LaunchError::io(format!("inspecting {}", dir.display()))(e)),
    };
    if !meta.is_dir() {
        return Ok(Ownership::Foreign);
    }
    let marked = std::fs::symlink_metadata(dir.join(MARKER)).is_ok_and(|m| m.is_file());
    if marked {
        return Ok(Ownership::Ours);
    }
    let mut entries =
        std::fs::read_dir(dir).map_err(LaunchError::io(format!("reading {}", dir.display())))?;
    Ok(if entries.next().is_none() {
        Ownership::Empty
    } else {
        Ownership::Foreign
    })
}

fn refusal(dir: &Path, doing: &str) -> LaunchError {
    LaunchError::Invalid(format!(
        "{}: refusing to {doing} it: it exists and a Docket launcher did not create it (no {MARKER} \
         in it, or not a plain directory); give --state-dir a new or empty directory",
        dir.display()
    ))
}

/// Makes `dir` a fresh, marked state directory: creates it, or empties one a launcher
/// created; refuses anything else.
pub fn prepare(dir: &Path) -> Result<(), LaunchError> {
    match ownership(dir)? {
        Ownership::Foreign => return Err(refusal(dir, "empty")),
        Ownership::Ours => {
            // What a cluster that was never brought down left mounted in it (the agents'
            // runtime tmpfs, jobfs, data disks): its files are not to be deleted one by one
            // through the mount, and its mount point could not be removed.
            crate::cleanup::unmount_under(dir);
            std::fs::remove_dir_all(dir)
                .map_err(LaunchError::io(format!("emptying {}", dir.display())))?
        }
        Ownership::Missing | Ownership::Empty => {}
    }
    std::fs::create_dir_all(dir).map_err(LaunchError::io(format!("creating {}", dir.display())))?;
    let marker = dir.join(MARKER);
    std::fs::write(&marker, MARKER_TEXT)
        .map_err(LaunchError::io(format!("writing {}", marker.display())))
}

/// Removes `dir` if a launcher created it (nothing there is fine); refuses anything else.
pub fn remove(dir: &Path) -> Result<(), LaunchError> {
    match ownership(dir)? {
        Ownership::Missing => Ok(()),
        Ownership::Foreign => Err(refusal(dir, "remove")),
        Ownership::Ours | Ownership::Empty => std::fs::remove_dir_all(dir)
            .map_err(LaunchError::io(format!("removing {}", dir.display()))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_marked_or_empty_directory_is_emptied_or_removed() {
        let base = tempfile::tempdir().unwrap();
        // Someone's directory with their files: refused both ways, left as it was.
        let theirs = base.path().join("home");
        std::fs::create_dir(&theirs).unwrap();
        std::fs::write(theirs.join("thesis.tex"), "years of work").unwrap();
        for result in [prepare(&theirs), remove(&theirs)] {
            let e = result.unwrap_err().to_string();
            assert!(e.contains("refusing") && e.contains(MARKER), "{e}");
        }
        assert!(theirs.join("thesis.tex").exists());
        // A file, and a symbolic link to a directory: refused too.
        let file = base.path().join("file");
        std::fs::write(&file, "x").unwrap();
        assert!(prepare(&file).is_err());
        let link = base.path().join("link");
        std::os::unix::fs::symlink(&theirs, &link).unwrap();
        assert_eq!(ownership(&link).unwrap(), Ownership::Foreign);
        assert!(prepare(&link).is_err() && remove(&link).is_err());
        assert!(theirs.join("thesis.tex").exists());
        // A new directory: created and marked; emptied on the next start; removed.
        let ours = base.path().join("cluster");
        prepare(&ours).unwrap();
        assert_eq!(ownership(&ours).unwrap(), Ownership::Ours);
        std::fs::write(ours.join("old-data"), "x").unwrap();
        prepare(&ours).unwrap();
        assert!(!ours.join("old-data").exists() && ours.join(MARKER).is_file());
        remove(&ours).unwrap();
        assert_eq!(ownership(&ours).unwrap(), Ownership::Missing);
        remove(&ours).unwrap();
        // An empty directory may be used.
        let empty = base.path().join("empty");
        std::fs::create_dir(&empty).unwrap();
        prepare(&empty).unwrap();
        assert_eq!(ownership(&empty).unwrap(), Ownership::Ours);
    }
}

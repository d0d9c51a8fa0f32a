//! Snapshot files on disk.
//!
//! A replica keeps its latest snapshot as one file under `<data dir>/snapshots/`, named by the
//! snapshot id, and its metadata in the database ([`cf::STATE`], key `snapshot`). A snapshot
//! travels as that file: openraft reads it in chunks to send it and writes received chunks
//! into a fresh `.part` file, so neither side ever holds a whole snapshot in memory.
//!
//! Files become the current snapshot atomically: written and fsynced under a temporary name,
//! renamed, the directory fsynced, and only then the metadata stored (synced). A crash at
//! any point leaves either the old snapshot current or the new one; stray files from an
//! interrupted write are removed at open.
//!
//! [`cf::STATE`]: crate::db::cf::STATE

use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncSeek, AsyncWrite, ReadBuf};

/// A snapshot's bytes on disk, as openraft reads and writes them, with the path it lives at.
#[derive(Debug)]
pub struct SnapshotFile {
    file: tokio::fs::File,
    path: PathBuf,
    /// Bytes a write handed to the file whose flush has not finished yet (see `poll_write`).
    unflushed: Option<usize>,
}

impl SnapshotFile {
    /// Opens an existing snapshot for reading.
    pub async fn open(path: PathBuf) -> io::Result<Self> {
        let file = tokio::fs::File::open(&path).await?;
        Ok(SnapshotFile {
            file,
            path,
            unflushed: None,
        })
    }

    /// Wraps an already open file.
    pub fn from_std(file: std::fs::File, path: PathBuf) -> Self {
        SnapshotFile {
            file: tokio::fs::File::from_std(file),
            path,
            unflushed: None,
        }
    }

    /// Creates (truncating) a file to receive a snapshot into.
    pub async fn create(path: PathBuf) -> io::Result<Self> {
        let file = tokio::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .await?;
        Ok(SnapshotFile {
            file,
            path,
            unflushed: None,
        })
    }

    /// Where the file is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Flushes and fsyncs the file, then gives back its path.
    pub async fn finish(mut self) -> io::Result<PathBuf> {
        use tokio::io::AsyncWriteExt;
        self.file.flush().await?;
        self.file.sync_all().await?;
        Ok(self.path)
    }
}

impl AsyncRead for SnapshotFile {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.file).poll_read(cx, buf)
    }
}

impl AsyncWrite for SnapshotFile {
    /// Writes through: a write is done once its bytes are in the file, not in tokio's
    /// buffer, because a received snapshot is read back through another handle to be
    /// checked before openraft installs it ([`crate::machine_store::MachineStore::check_received`]).
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let n = match self.unflushed {
            Some(n) => n,
            None => {
                let n = std::task::ready!(Pin::new(&mut self.file).poll_write(cx, buf))?;
                self.unflushed = Some(n);
                n
            }
        };
        let flushed = Pin::new(&mut self.file).poll_flush(cx);
        if flushed.is_ready() {
            self.unflushed = None;
        }
        flushed.map_ok(|()| n)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.file).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.file).poll_shutdown(cx)
    }
}

impl AsyncSeek for SnapshotFile {
    fn start_seek(mut self: Pin<&mut Self>, position: io::SeekFrom) -> io::Result<()> {
        Pin::new(&mut self.file).start_seek(position)
    }

    fn poll_complete(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<u64>> {
        Pin::new(&mut self.file).poll_complete(cx)
    }
}

/// The directory of a replica's snapshot files.
#[derive(Debug)]
pub struct SnapshotDir {
    dir: PathBuf,
    /// Distinguishes temporary files made in one process.
    next_temp: AtomicU64,
}

impl SnapshotDir {
    /// Opens (creating) `dir`, removing every file but `keep` (the current snapshot's name).
    pub fn open(dir: PathBuf, keep: Option<&str>) -> io::Result<Self> {
        std::fs::create_dir_all(&dir)?;
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            let name = entry.file_name();
            let current = keep.is_some_and(|k| name.to_str() == Some(&file_name(k)));
            if !current && entry.file_type()?.is_file() {
                std::fs::remove_file(entry.path())?;
            }
        }
        Ok(SnapshotDir {
            dir,
            next_temp: AtomicU64::new(0),
        })
    }

    /// The path of the snapshot with id `snapshot_id`.
    pub fn path_of(&self, snapshot_id: &str) -> PathBuf {
        self.dir.join(file_name(snapshot_id))
    }

    /// A fresh temporary path to write a snapshot into before it is renamed.
    pub fn temp_path(&self) -> PathBuf {
        let n = self.next_temp.fetch_add(1, Ordering::Relaxed);
        self.dir
            .join(format!("incoming-{}-{n}.part", std::process::id()))
    }

    /// Renames the finished file at `temp` to be snapshot `snapshot_id`, durably.
    pub fn commit(&self, temp: &Path, snapshot_id: &str) -> io::Result<PathBuf> {
        let path = self.path_of(snapshot_id);
        std::fs::rename(temp, &path)?;
        std::fs::File::open(&self.dir)?.sync_all()?;
        Ok(path)
    }

    /// Removes snapshot `snapshot_id`'s file, if there.
    pub fn remove(&self, snapshot_id: &str) -> io::Result<()> {
        match std::fs::remove_file(self.path_of(snapshot_id)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }
}

/// A snapshot id as a file name. Ids are ours (`term-index-n`), but a received one comes from
/// another replica: anything but `[A-Za-z0-9_-]` is replaced so it cannot leave the directory.
fn file_name(snapshot_id: &str) -> String {
    let safe: String = snapshot_id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("{safe}.snap")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_received_snapshot_id_cannot_escape_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        let snaps = SnapshotDir::open(dir.path().join("snapshots"), None).unwrap();
        let path = snaps.path_of("../../etc/passwd");
        assert_eq!(path.parent(), Some(dir.path().join("snapshots").as_path()));
        assert_eq!(path.file_name().unwrap(), "______etc_passwd.snap");
    }

    #[test]
    fn open_removes_everything_but_the_current_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("snapshots");
        std::fs::create_dir_all(&path).unwrap();
        std::fs::write(path.join("1-5-0.snap"), b"old").unwrap();
        std::fs::write(path.join("2-9-0.snap"), b"current").unwrap();
        std::fs::write(path.join("incoming-1-0.part"), b"half").unwrap();
        let snaps = SnapshotDir::open(path.clone(), Some("2-9-0")).unwrap();
        let left: Vec<_> = std::fs::read_dir(&path)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(left, vec!["2-9-0.snap".to_owned()]);
        assert!(snaps.path_of("2-9-0").exists());
    }
}

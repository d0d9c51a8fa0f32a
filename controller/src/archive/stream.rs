//! The archive's part of a snapshot: every record, after the queue.
//!
//! Layout: the magic `DKTA`, a big-endian u16 format (docket-core's snapshot format, since a
//! record is a docket-core job, read in that format's [`Layout`]), the u64 log position the records are complete through, then
//! each record as a big-endian u32 length and its postcard bytes, a zero length, and the u64
//! count of records (so a stream cut short is refused, never taken as a smaller history).
//! Lengths are bounded ([`MAX_RECORD_BYTES`]): a hostile or corrupt stream cannot make a
//! replica allocate more than that for one record.

use std::io::{self, Read, Write};

use docket_core::layout::{self, Layout};
use docket_core::snapshot::{OLDEST_SNAPSHOT_FORMAT, SNAPSHOT_FORMAT};

use super::{ArchiveCheckpoint, ArchiveError, ArchivedJob};

const MAGIC: &[u8; 4] = b"DKTA";
/// The largest record accepted (a job record with its steps is a few KiB).
pub const MAX_RECORD_BYTES: u32 = 16 << 20;

/// Writes the section for `checkpoint`, complete through `position`.
pub fn write(
    checkpoint: &ArchiveCheckpoint,
    position: u64,
    out: &mut dyn Write,
) -> io::Result<u64> {
    out.write_all(MAGIC)?;
    out.write_all(&SNAPSHOT_FORMAT.to_be_bytes())?;
    out.write_all(&position.to_be_bytes())?;
    let mut count = 0u64;
    let mut failed: Option<io::Error> = None;
    checkpoint
        .scan(|record| {
            let written = postcard::to_stdvec(&record)
                .map_err(io::Error::other)
                .and_then(|bytes| {
                    let len = u32::try_from(bytes.len())
                        .ok()
                        .filter(|l| *l <= MAX_RECORD_BYTES)
                        .ok_or_else(|| {
                            io::Error::other(format!(
                                "job {}'s record is {} bytes, over {MAX_RECORD_BYTES}",
                                record.job.id.0,
                                bytes.len()
                            ))
                        })?;
                    out.write_all(&len.to_be_bytes())?;
                    out.write_all(&bytes)
                });
            match written {
                Ok(()) => {
                    count += 1;
                    true
                }
                Err(e) => {
                    failed = Some(e);
                    false
                }
            }
        })
        .map_err(io::Error::other)?;
    if let Some(e) = failed {
        return Err(e);
    }
    out.write_all(&0u32.to_be_bytes())?;
    out.write_all(&count.to_be_bytes())?;
    Ok(count)
}

/// A section being read: its position, then its records one by one.
pub struct Reader<'a> {
    input: &'a mut dyn Read,
    /// The layout its records were written in.
    layout: Layout,
    pub position: u64,
    read: u64,
    done: bool,
}

impl std::fmt::Debug for Reader<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reader")
            .field("position", &self.position)
            .field("read", &self.read)
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

fn invalid(what: String) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("archive section: {what}"),
    )
}

fn read_array<const N: usize>(input: &mut dyn Read, what: &str) -> io::Result<[u8; N]> {
    let mut buf = [0u8; N];
    input.read_exact(&mut buf).map_err(|e| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            invalid(format!("cut short in the {what}"))
        } else {
            e
        }
    })?;
    Ok(buf)
}

impl<'a> Reader<'a> {
    /// Reads the header.
    pub fn new(input: &'a mut dyn Read) -> io::Result<Self> {
        let magic: [u8; 4] = read_array(input, "magic")?;
        if &magic != MAGIC {
            return Err(invalid("bad magic".into()));
        }
        let format = u16::from_be_bytes(read_array(input, "format")?);
        if !(OLDEST_SNAPSHOT_FORMAT..=SNAPSHOT_FORMAT).contains(&format) {
            return Err(invalid(format!(
                "records of format {format}; this build reads formats \
                 {OLDEST_SNAPSHOT_FORMAT} to {SNAPSHOT_FORMAT}"
            )));
        }
        let position = u64::from_be_bytes(read_array(input, "position")?);
        Ok(Reader {
            input,
            layout: docket_core::snapshot::layout_of(format),
            position,
            read: 0,
            done: false,
        })
    }

    fn next_record(&mut self) -> io::Result<Option<ArchivedJob>> {
        if self.done {
            return Ok(None);
        }
        let len = u32::from_be_bytes(read_array(self.input, "record length")?);
        if len == 0 {
            self.done = true;
            let count = u64::from_be_bytes(read_array(self.input, "record count")?);
            if count != self.read {
                return Err(invalid(format!(
                    "{} records read but the section says {count}",
                    self.read
                )));
            }
            return Ok(None);
        }
        if len > MAX_RECORD_BYTES {
            return Err(invalid(format!(
                "a record of {len} bytes, over the limit of {MAX_RECORD_BYTES}"
            )));
        }
        let mut bytes = Vec::new();
        (&mut *self.input)
            .take(u64::from(len))
            .read_to_end(&mut bytes)?;
        if bytes.len() != len as usize {
            return Err(invalid("cut short in a record".into()));
        }
        let record: ArchivedJob = layout::reading(self.layout, || postcard::from_bytes(&bytes))
            .map_err(|e| invalid(format!("record {} does not decode: {e}", self.read + 1)))?;
        self.read += 1;
        Ok(Some(record))
    }
}

impl Iterator for Reader<'_> {
    type Item = Result<ArchivedJob, ArchiveError>;

    fn next(&mut self) -> Option<Self::Item> {
        match self.next_record() {
            Ok(Some(r)) => Some(Ok(r)),
            Ok(None) => None,
            Err(source) => {
                self.done = true;
                Some(Err(ArchiveError::Io {
                    path: std::path::PathBuf::from("<snapshot>"),
                    what: "reading the snapshot's archive section",
                    source,
                }))
            }
        }
    }
}

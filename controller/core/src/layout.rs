//! Which layout of the replicated data a decoder is reading.
//!
//! State, commands and archived records are postcard: a struct is its fields one after the
//! other, with no names and no lengths, so a field added to a struct shifts everything after
//! it and bytes written before the field existed no longer decode. Yet those bytes live on in
//! every replica's Raft log, in snapshots and in the accounting archive, and a rolling upgrade
//! must read them.
//!
//! So every place old bytes can come from says which layout it wrote — the command
//! [`Envelope`](crate::Envelope)'s version, the snapshot format, the archive's record format —
//! and its decoder reads within [`reading`] that [`Layout`]. A field added later is marked
//! `#[serde(deserialize_with = "crate::layout::since_v2")]` (one such function per
//! layout): while an older layout is being read the field takes its default without consuming
//! a byte, and the fields around it decode as they were written.
//!
//! The layout is a thread-local set for the extent of one decode or encode and restored after
//! it, so nested ones (a snapshot holding jobs, a log entry holding envelopes) each see their
//! own. Encoding writes the layout in effect too: an envelope of an older version is written
//! as that version wrote it (its added fields skipped, `skip_serializing_if =
//! "crate::layout::before_v2"`), so bytes read and written again are the same bytes; everything
//! else is written in [`Layout::CURRENT`].

use std::cell::Cell;

use serde::{Deserialize, Deserializer};

/// A layout of the replicated data, oldest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Layout {
    /// Command version 3, snapshot format 4, archive records without a format mark.
    V1,
    /// Command version 4, snapshot format 5, archive record format 2: jobs' comments
    /// ([`JobSpec::comment`](crate::job::JobSpec::comment), `sbatch --comment`) and the
    /// billing an allocation was weighed at when it started
    /// ([`Allocation::billing_milli`](crate::job::Allocation::billing_milli)).
    V2,
}

impl Layout {
    /// What this build writes.
    pub const CURRENT: Layout = Layout::V2;
}

thread_local! {
    static READING: Cell<Layout> = const { Cell::new(Layout::CURRENT) };
}

/// Runs `decode` reading `layout`, and restores the layout read before.
pub fn reading<T>(layout: Layout, decode: impl FnOnce() -> T) -> T {
    let _restore = Scope::enter(layout);
    decode()
}

/// The layout being read on this thread.
pub fn current() -> Layout {
    READING.with(Cell::get)
}

/// Sets the layout being read until dropped; for decoders that cannot wrap their work in a
/// closure (a serde visitor reading its first field to learn the layout of the rest).
#[derive(Debug)]
#[must_use = "the layout is restored when the scope drops"]
pub struct Scope {
    previous: Layout,
    /// Not `Send`: it restores this thread's layout, so it must not move to another.
    _this_thread: std::marker::PhantomData<*const ()>,
}

impl Scope {
    pub fn enter(layout: Layout) -> Scope {
        Scope {
            previous: READING.with(|r| r.replace(layout)),
            _this_thread: std::marker::PhantomData,
        }
    }
}

impl Drop for Scope {
    fn drop(&mut self) {
        READING.with(|r| r.set(self.previous));
    }
}

/// Whether a field added in [`Layout::V2`] is left out: an older layout is being written.
pub fn before_v2<T>(_: &T) -> bool {
    current() < Layout::V2
}

/// A field added in [`Layout::V2`]: its default when an older layout is being read.
pub fn since_v2<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    if current() < Layout::V2 {
        Ok(T::default())
    } else {
        T::deserialize(deserializer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Serialize;

    #[derive(Debug, Serialize, Deserialize, PartialEq)]
    struct Before {
        a: u32,
        b: String,
    }

    #[derive(Debug, Serialize, Deserialize, PartialEq)]
    struct After {
        a: u32,
        #[serde(deserialize_with = "since_v2", default)]
        added: Option<String>,
        b: String,
    }

    #[test]
    fn bytes_of_the_older_layout_decode_with_the_added_field_defaulted() {
        let old = postcard::to_stdvec(&Before {
            a: 7,
            b: "x".into(),
        })
        .unwrap();
        let read: After = reading(Layout::V1, || postcard::from_bytes(&old)).unwrap();
        assert_eq!(
            read,
            After {
                a: 7,
                added: None,
                b: "x".into()
            }
        );
        // Read as the current layout, the same bytes are misread or refused: the mark matters.
        let misread: Result<After, _> = postcard::from_bytes(&old);
        assert_ne!(misread.ok(), Some(read));
    }

    #[test]
    fn the_current_layout_round_trips_and_the_scope_is_restored() {
        let new = After {
            a: 1,
            added: Some("c".into()),
            b: "y".into(),
        };
        let bytes = postcard::to_stdvec(&new).unwrap();
        let read: After = reading(Layout::V1, || {
            assert_eq!(current(), Layout::V1);
            reading(Layout::CURRENT, || postcard::from_bytes(&bytes)).unwrap()
        });
        assert_eq!(read, new);
        assert_eq!(current(), Layout::CURRENT);
    }
}

//! Job arrays: which task indexes a job has and how many may run at once.
//!
//! A pending array is one record whose pending indexes are a [`IndexSet`] of ranges, so a
//! 10,000-task array costs a few bytes until its tasks start. Syntax is Slurm's `--array`:
//! `0-31`, `1,3,5,7`, `1-7:2`, each optionally followed by `%N`, the most tasks that may run
//! at the same time.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A set of array indexes, stored as sorted, disjoint, non-adjacent inclusive ranges.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct IndexSet {
    ranges: Vec<(u32, u32)>,
}

impl IndexSet {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn from_indexes(indexes: impl IntoIterator<Item = u32>) -> Self {
        let mut set = IndexSet::new();
        for i in indexes {
            set.insert(i);
        }
        set
    }

    pub fn len(&self) -> u64 {
        self.ranges
            .iter()
            .map(|&(lo, hi)| u64::from(hi - lo) + 1)
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    pub fn contains(&self, i: u32) -> bool {
        self.position(i).is_ok()
    }

    pub fn first(&self) -> Option<u32> {
        self.ranges.first().map(|r| r.0)
    }

    pub fn last(&self) -> Option<u32> {
        self.ranges.last().map(|r| r.1)
    }

    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.ranges.iter().flat_map(|&(lo, hi)| lo..=hi)
    }

    /// The ranges, for display and invariant checks.
    pub fn ranges(&self) -> &[(u32, u32)] {
        &self.ranges
    }

    /// `Ok(k)` if range `k` holds `i`; `Err(k)` if `i` would go before range `k`.
    fn position(&self, i: u32) -> Result<usize, usize> {
        self.ranges.binary_search_by(|&(lo, hi)| {
            if hi < i {
                std::cmp::Ordering::Less
            } else if lo > i {
                std::cmp::Ordering::Greater
            } else {
                std::cmp::Ordering::Equal
            }
        })
    }

    /// Adds `i`; returns whether it was new.
    pub fn insert(&mut self, i: u32) -> bool {
        let k = match self.position(i) {
            Ok(_) => return false,
            Err(k) => k,
        };
        let joins_prev = k > 0 && self.ranges[k - 1].1.checked_add(1) == Some(i);
        let joins_next = k < self.ranges.len() && i.checked_add(1) == Some(self.ranges[k].0);
        match (joins_prev, joins_next) {
            (true, true) => {
                self.ranges[k - 1].1 = self.ranges[k].1;
                self.ranges.remove(k);
            }
            (true, false) => self.ranges[k - 1].1 = i,
            (false, true) => self.ranges[k].0 = i,
            (false, false) => self.ranges.insert(k, (i, i)),
        }
        true
    }

    /// Removes `i`; returns whether it was present.
    pub fn remove(&mut self, i: u32) -> bool {
        let k = match self.position(i) {
            Ok(k) => k,
            Err(_) => return false,
        };
        let (lo, hi) = self.ranges[k];
        if lo == hi {
            self.ranges.remove(k);
        } else if i == lo {
            self.ranges[k].0 = i + 1;
        } else if i == hi {
            self.ranges[k].1 = i - 1;
        } else {
            self.ranges[k].1 = i - 1;
            self.ranges.insert(k + 1, (i + 1, hi));
        }
        true
    }

    /// Removes and returns the lowest index.
    pub fn pop_first(&mut self) -> Option<u32> {
        let first = self.first()?;
        self.remove(first);
        Some(first)
    }

    /// The invariant: sorted, disjoint, non-adjacent, each range non-empty.
    pub fn is_canonical(&self) -> bool {
        self.ranges.iter().all(|&(lo, hi)| lo <= hi)
            && self
                .ranges
                .windows(2)
                .all(|w| u64::from(w[0].1) + 1 < u64::from(w[1].0))
    }
}

/// Slurm's compact form: `1-3,5,7-9`.
impl fmt::Display for IndexSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (n, &(lo, hi)) in self.ranges.iter().enumerate() {
            if n > 0 {
                f.write_str(",")?;
            }
            if lo == hi {
                write!(f, "{lo}")?;
            } else {
                write!(f, "{lo}-{hi}")?;
            }
        }
        Ok(())
    }
}

/// What `--array` asked for.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ArraySpec {
    pub indexes: IndexSet,
    /// At most this many tasks running at once (`%N`).
    pub throttle: Option<u32>,
}

/// Why an `--array` value was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArrayParseError {
    #[error("array: empty specification")]
    Empty,
    #[error("array: {part:?} is not an index, a range `A-B` or a stepped range `A-B:S`")]
    Syntax { part: String },
    #[error("array: range {part:?} ends before it starts")]
    Backwards { part: String },
    #[error("array: step in {part:?} must be at least 1")]
    ZeroStep { part: String },
    #[error("array: index {index} is above the maximum {max} (MaxArraySize - 1)")]
    IndexTooLarge { index: u64, max: u32 },
    #[error("array: throttle {value:?} after '%' must be a whole number of at least 1")]
    Throttle { value: String },
}

impl ArraySpec {
    /// Parses Slurm's `--array` syntax. `max_index` is `MaxArraySize - 1`; it bounds the work
    /// done, so an absurd range is refused before anything is expanded.
    pub fn parse(s: &str, max_index: u32) -> Result<ArraySpec, ArrayParseError> {
        let s = s.trim();
        let (list, throttle) = match s.split_once('%') {
            Some((list, t)) => {
                let n: u32 = t.parse().map_err(|_| ArrayParseError::Throttle {
                    value: t.to_owned(),
                })?;
                if n == 0 {
                    return Err(ArrayParseError::Throttle {
                        value: t.to_owned(),
                    });
                }
                (list, Some(n))
            }
            None => (s, None),
        };
        if list.is_empty() {
            return Err(ArrayParseError::Empty);
        }
        let mut indexes = IndexSet::new();
        for part in list.split(',') {
            let syntax = || ArrayParseError::Syntax {
                part: part.to_owned(),
            };
            let num = |t: &str| -> Result<u64, ArrayParseError> {
                let v: u64 = t.trim().parse().map_err(|_| syntax())?;
                if v > u64::from(max_index) {
                    return Err(ArrayParseError::IndexTooLarge {
                        index: v,
                        max: max_index,
                    });
                }
                Ok(v)
            };
            let (range, step) = match part.split_once(':') {
                Some((r, st)) => {
                    let step: u64 = st.trim().parse().map_err(|_| syntax())?;
                    if step == 0 {
                        return Err(ArrayParseError::ZeroStep {
                            part: part.to_owned(),
                        });
                    }
                    (r, step)
                }
                None => (part, 1),
            };
            let (lo, hi) = match range.split_once('-') {
                Some((a, b)) => (num(a)?, num(b)?),
                None => {
                    if step != 1 {
                        return Err(syntax());
                    }
                    let v = num(range)?;
                    (v, v)
                }
            };
            if hi < lo {
                return Err(ArrayParseError::Backwards {
                    part: part.to_owned(),
                });
            }
            // Bounded by max_index, so this loop is bounded by MaxArraySize.
            let mut i = lo;
            while i <= hi {
                indexes.insert(i as u32);
                i += step;
            }
        }
        Ok(ArraySpec { indexes, throttle })
    }
}

/// Slurm's folded form, as squeue prints a pending array: `0-31%4`.
impl fmt::Display for ArraySpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.indexes)?;
        if let Some(t) = self.throttle {
            write!(f, "%{t}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn idx(spec: &ArraySpec) -> Vec<u32> {
        spec.indexes.iter().collect()
    }

    #[test]
    fn slurm_forms_parse() {
        assert_eq!(idx(&ArraySpec::parse("0-31", 1000).unwrap()).len(), 32);
        assert_eq!(
            idx(&ArraySpec::parse("1,3,5,7", 1000).unwrap()),
            [1, 3, 5, 7]
        );
        assert_eq!(idx(&ArraySpec::parse("1-7:2", 1000).unwrap()), [1, 3, 5, 7]);
        let t = ArraySpec::parse("0-15%4", 1000).unwrap();
        assert_eq!(t.throttle, Some(4));
        assert_eq!(t.to_string(), "0-15%4");
        assert_eq!(
            ArraySpec::parse("3,1-2,9", 1000).unwrap().to_string(),
            "1-3,9"
        );
    }

    #[test]
    fn bad_forms_name_the_problem() {
        assert_eq!(ArraySpec::parse("", 10), Err(ArrayParseError::Empty));
        assert!(matches!(
            ArraySpec::parse("5-1", 10),
            Err(ArrayParseError::Backwards { .. })
        ));
        assert!(matches!(
            ArraySpec::parse("1-5:0", 10),
            Err(ArrayParseError::ZeroStep { .. })
        ));
        assert!(matches!(
            ArraySpec::parse("a-b", 10),
            Err(ArrayParseError::Syntax { .. })
        ));
        assert!(matches!(
            ArraySpec::parse("1-5%0", 10),
            Err(ArrayParseError::Throttle { .. })
        ));
        let err = ArraySpec::parse("0-4294967295", 1000).unwrap_err();
        assert_eq!(
            err,
            ArrayParseError::IndexTooLarge {
                index: 4_294_967_295,
                max: 1000
            }
        );
        assert!(err.to_string().contains("MaxArraySize"));
    }

    #[test]
    fn index_set_stays_canonical_under_inserts_and_removes() {
        let mut s = IndexSet::from_indexes([5, 1, 2, 3, 7, 6]);
        assert_eq!(s.ranges(), &[(1, 3), (5, 7)]);
        assert!(s.insert(4));
        assert_eq!(s.ranges(), &[(1, 7)]);
        assert!(s.remove(4));
        assert_eq!(s.ranges(), &[(1, 3), (5, 7)]);
        assert!(!s.remove(4));
        assert_eq!(s.pop_first(), Some(1));
        assert_eq!(s.len(), 5);
        assert!(s.is_canonical());
        let mut edge = IndexSet::from_indexes([u32::MAX, 0]);
        assert!(edge.insert(u32::MAX - 1));
        assert!(edge.is_canonical());
        assert_eq!(edge.len(), 3);
    }
}

//! Job dependencies: `-d afterok:20:21,afterany:23`, Slurm's syntax, which PBS's
//! `-W depend=` shares.
//!
//! A comma joins clauses with AND, a `?` with OR (one expression uses one or the other, as in
//! Slurm). Each clause names a kind and one or more jobs (`123` or an array task `123_7`);
//! `after` may carry a delay in minutes (`after:123+10`); `singleton` names no job.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::ids::JobId;
use crate::quantity::Seconds;

/// A job, or one task of an array job, named in a dependency.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct JobRef {
    pub job: JobId,
    pub task: Option<u32>,
}

impl fmt::Display for JobRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.task {
            Some(t) => write!(f, "{}_{t}", self.job),
            None => write!(f, "{}", self.job),
        }
    }
}

/// What must have happened to the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DepKind {
    /// The target has started (or ended without starting), plus a delay.
    After { delay: Seconds },
    /// The target has ended, however.
    AfterAny,
    /// The target has completed with exit code 0.
    AfterOk,
    /// The target has ended in failure (non-zero, timeout, cancelled, OOM, node failure).
    AfterNotOk,
    /// The task of the target array with the same index has completed successfully.
    AfterCorr,
    /// No other job of the same name and user is running or ahead of it.
    Singleton,
}

impl DepKind {
    fn name(self) -> &'static str {
        match self {
            DepKind::After { .. } => "after",
            DepKind::AfterAny => "afterany",
            DepKind::AfterOk => "afterok",
            DepKind::AfterNotOk => "afternotok",
            DepKind::AfterCorr => "aftercorr",
            DepKind::Singleton => "singleton",
        }
    }
}

/// One condition: a kind and, except for `singleton`, the job it waits on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct DepClause {
    pub kind: DepKind,
    pub target: Option<JobRef>,
}

/// How clauses combine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Combine {
    /// `,`: every clause.
    All,
    /// `?`: any clause.
    Any,
}

/// A parsed dependency expression.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Dependency {
    pub clauses: Vec<DepClause>,
    pub combine: Combine,
}

/// The most clauses one expression may carry; more is a mistake, not a workflow.
pub const MAX_DEP_CLAUSES: usize = 1024;

/// Why a dependency expression was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DependencyParseError {
    #[error("dependency: empty expression")]
    Empty,
    #[error("dependency: mixes ',' (all) and '?' (any) in one expression")]
    MixedSeparators,
    #[error(
        "dependency: unknown type {kind:?}; expected after, afterany, afterok, afternotok, \
         aftercorr or singleton"
    )]
    UnknownKind { kind: String },
    #[error("dependency: {clause:?} names no job")]
    NoJob { clause: String },
    #[error("dependency: singleton takes no job id")]
    SingletonWithJob,
    #[error("dependency: {value:?} is not a job id (`123` or `123_7`)")]
    BadJobId { value: String },
    #[error("dependency: delay in {value:?} must be whole minutes (`after:123+10`)")]
    BadDelay { value: String },
    #[error("dependency: a delay (+min) is only allowed with `after`")]
    DelayNotAfter,
    #[error("dependency: more than {MAX_DEP_CLAUSES} clauses")]
    TooMany,
}

fn parse_ref(value: &str) -> Result<(JobRef, Option<u64>), DependencyParseError> {
    let bad = || DependencyParseError::BadJobId {
        value: value.to_owned(),
    };
    let (id, delay) = match value.split_once('+') {
        Some((id, d)) => {
            let m: u64 = d.parse().map_err(|_| DependencyParseError::BadDelay {
                value: value.to_owned(),
            })?;
            (id, Some(m))
        }
        None => (value, None),
    };
    let (job, task) = match id.split_once('_') {
        Some((j, t)) => (j, Some(t.parse::<u32>().map_err(|_| bad())?)),
        None => (id, None),
    };
    let job: u64 = job.parse().map_err(|_| bad())?;
    Ok((
        JobRef {
            job: JobId(job),
            task,
        },
        delay,
    ))
}

impl Dependency {
    /// Parses Slurm's `--dependency` value.
    pub fn parse(s: &str) -> Result<Dependency, DependencyParseError> {
        let s = s.trim();
        if s.is_empty() {
            return Err(DependencyParseError::Empty);
        }
        let (combine, sep) = match (s.contains(','), s.contains('?')) {
            (true, true) => return Err(DependencyParseError::MixedSeparators),
            (false, true) => (Combine::Any, '?'),
            _ => (Combine::All, ','),
        };
        let mut clauses = Vec::new();
        for part in s.split(sep) {
            let mut fields = part.split(':');
            let kind_name = fields
                .next()
                .unwrap_or_default()
                .trim()
                .to_ascii_lowercase();
            let base = match kind_name.as_str() {
                "after" => DepKind::After {
                    delay: Seconds::ZERO,
                },
                "afterany" => DepKind::AfterAny,
                "afterok" => DepKind::AfterOk,
                "afternotok" => DepKind::AfterNotOk,
                "aftercorr" => DepKind::AfterCorr,
                "singleton" => DepKind::Singleton,
                _ => {
                    return Err(DependencyParseError::UnknownKind {
                        kind: kind_name.clone(),
                    });
                }
            };
            let targets: Vec<&str> = fields.collect();
            if base == DepKind::Singleton {
                if !targets.is_empty() {
                    return Err(DependencyParseError::SingletonWithJob);
                }
                clauses.push(DepClause {
                    kind: base,
                    target: None,
                });
                continue;
            }
            if targets.is_empty() || targets.iter().any(|t| t.is_empty()) {
                return Err(DependencyParseError::NoJob {
                    clause: part.to_owned(),
                });
            }
            for t in targets {
                let (target, delay) = parse_ref(t.trim())?;
                let kind = match (base, delay) {
                    (DepKind::After { .. }, Some(m)) => DepKind::After {
                        delay: Seconds(m.saturating_mul(60)),
                    },
                    (_, Some(_)) => return Err(DependencyParseError::DelayNotAfter),
                    (k, None) => k,
                };
                clauses.push(DepClause {
                    kind,
                    target: Some(target),
                });
                if clauses.len() > MAX_DEP_CLAUSES {
                    return Err(DependencyParseError::TooMany);
                }
            }
        }
        Ok(Dependency { clauses, combine })
    }

    /// Every job this expression waits on.
    pub fn targets(&self) -> impl Iterator<Item = JobRef> + '_ {
        self.clauses.iter().filter_map(|c| c.target)
    }
}

/// Slurm's canonical form: one clause per target, `,` or `?` between them.
impl fmt::Display for Dependency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sep = match self.combine {
            Combine::All => ",",
            Combine::Any => "?",
        };
        for (n, c) in self.clauses.iter().enumerate() {
            if n > 0 {
                f.write_str(sep)?;
            }
            f.write_str(c.kind.name())?;
            if let Some(t) = c.target {
                write!(f, ":{t}")?;
            }
            if let DepKind::After { delay } = c.kind
                && delay.0 > 0
            {
                write!(f, "+{}", delay.0 / 60)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(job: u64, task: Option<u32>) -> Option<JobRef> {
        Some(JobRef {
            job: JobId(job),
            task,
        })
    }

    #[test]
    fn slurm_examples_parse() {
        let d = Dependency::parse("afterok:20:21,afterany:23").unwrap();
        assert_eq!(d.combine, Combine::All);
        assert_eq!(
            d.clauses,
            vec![
                DepClause {
                    kind: DepKind::AfterOk,
                    target: r(20, None)
                },
                DepClause {
                    kind: DepKind::AfterOk,
                    target: r(21, None)
                },
                DepClause {
                    kind: DepKind::AfterAny,
                    target: r(23, None)
                },
            ]
        );
        let any = Dependency::parse("afterok:1?afternotok:2_7").unwrap();
        assert_eq!(any.combine, Combine::Any);
        assert_eq!(any.clauses[1].target, r(2, Some(7)));
        let after = Dependency::parse("after:5+10").unwrap();
        assert_eq!(
            after.clauses[0].kind,
            DepKind::After {
                delay: Seconds(600)
            }
        );
        assert_eq!(after.to_string(), "after:5+10");
        let single = Dependency::parse("singleton").unwrap();
        assert_eq!(
            single.clauses[0],
            DepClause {
                kind: DepKind::Singleton,
                target: None
            }
        );
        assert_eq!(
            Dependency::parse("aftercorr:9,singleton")
                .unwrap()
                .to_string(),
            "aftercorr:9,singleton"
        );
    }

    #[test]
    fn bad_expressions_say_what_is_wrong() {
        use DependencyParseError as E;
        assert_eq!(Dependency::parse(" "), Err(E::Empty));
        assert_eq!(
            Dependency::parse("afterok:1,afterok:2?afterany:3"),
            Err(E::MixedSeparators)
        );
        assert!(matches!(
            Dependency::parse("before:1"),
            Err(E::UnknownKind { .. })
        ));
        assert!(matches!(Dependency::parse("afterok"), Err(E::NoJob { .. })));
        assert!(matches!(
            Dependency::parse("afterok:"),
            Err(E::NoJob { .. })
        ));
        assert_eq!(Dependency::parse("singleton:4"), Err(E::SingletonWithJob));
        assert!(matches!(
            Dependency::parse("afterok:x1"),
            Err(E::BadJobId { .. })
        ));
        assert!(matches!(
            Dependency::parse("after:1+x"),
            Err(E::BadDelay { .. })
        ));
        assert_eq!(Dependency::parse("afterok:1+5"), Err(E::DelayNotAfter));
        let many = format!("afterok:{}", vec!["1"; MAX_DEP_CLAUSES + 1].join(":"));
        assert_eq!(Dependency::parse(&many), Err(E::TooMany));
    }
}

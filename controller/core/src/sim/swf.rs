//! The Standard Workload Format (Feitelson's Parallel Workloads Archive): one job per line,
//! 18 whitespace-separated fields, `;` header comments (`; MaxProcs: 128`).
//!
//! Conventions (the Standard Workload Format's, as Feitelson's Parallel Workloads Archive defines them, and Docket's for the rest): procs = requested processors (field 8) if positive, else the
//! allocated ones (field 5); runtime = field 4; the estimate = requested time (field 9) if
//! positive, else the runtime; the runtime is capped at the estimate. Jobs with a negative
//! runtime, no processors, or more than the machine has are dropped and counted.

use std::fmt;

/// One job of a trace, as the replay uses it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SwfJob {
    /// Field 1.
    pub id: u64,
    /// Field 2: seconds from the start of the trace.
    pub submit: u64,
    /// Field 4, capped at the estimate.
    pub runtime: u64,
    pub procs: u64,
    /// Field 9 if positive, else the runtime.
    pub estimate: u64,
    /// Fields 12, 13, 15, 16 (-1 = unknown).
    pub user: i64,
    pub group: i64,
    pub queue: i64,
    pub partition: i64,
}

/// A parsed trace.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Trace {
    pub jobs: Vec<SwfJob>,
    pub max_procs: Option<u64>,
    pub max_nodes: Option<u64>,
    /// Lines that are not jobs and not comments (reported, never fatal).
    pub malformed: Vec<usize>,
    /// Jobs dropped: a negative runtime or submit time, or no processors.
    pub dropped: usize,
}

impl Trace {
    /// `samples` sequences of `size` consecutive jobs, evenly spaced from the first job to
    /// the last full sequence, each shifted to start at time 0 (as the published
    /// evaluations sample a trace: Zhang et al., RLScheduler, SC'20, use 1,024 jobs). Fewer
    /// when the trace is shorter; one (the whole trace) when it holds `size` jobs or fewer.
    pub fn windows(&self, size: usize, samples: usize) -> Vec<Trace> {
        let size = size.max(1);
        let n = self.jobs.len();
        let last = n.saturating_sub(size);
        let samples = samples.clamp(1, last + 1);
        (0..samples)
            .map(|i| {
                let from = if samples == 1 {
                    0
                } else {
                    i * last / (samples - 1)
                };
                let jobs = &self.jobs[from..(from + size).min(n)];
                let t0 = jobs.iter().map(|j| j.submit).min().unwrap_or(0);
                Trace {
                    jobs: jobs
                        .iter()
                        .map(|j| SwfJob {
                            submit: j.submit - t0,
                            ..j.clone()
                        })
                        .collect(),
                    max_procs: self.max_procs,
                    max_nodes: self.max_nodes,
                    malformed: Vec::new(),
                    dropped: 0,
                }
            })
            .collect()
    }

    /// The offered load on `procs` processors: the jobs' processor-seconds over the
    /// processor-seconds between the first and the last submission.
    pub fn offered_load(&self, procs: u64) -> f64 {
        let first = self.jobs.iter().map(|j| j.submit).min().unwrap_or(0);
        let last = self.jobs.iter().map(|j| j.submit).max().unwrap_or(0);
        let work: f64 = self
            .jobs
            .iter()
            .map(|j| j.runtime as f64 * j.procs as f64)
            .sum();
        let span = (last - first).max(1) as f64 * procs.max(1) as f64;
        work / span
    }

    /// The same jobs arriving faster or slower so that the offered load on `procs` is
    /// `load`: every interval between submissions scaled by one factor, as evaluations of
    /// scheduling policies compare them at a chosen load (Feitelson, "Workload Modeling
    /// for Computer Systems Performance Evaluation", 2015, ch. 9).
    pub fn at_load(&self, procs: u64, load: f64) -> Trace {
        let current = self.offered_load(procs);
        let factor = if load > 0.0 && current > 0.0 {
            current / load
        } else {
            1.0
        };
        let first = self.jobs.iter().map(|j| j.submit).min().unwrap_or(0);
        Trace {
            jobs: self
                .jobs
                .iter()
                .map(|j| SwfJob {
                    submit: first + ((j.submit - first) as f64 * factor).round() as u64,
                    ..j.clone()
                })
                .collect(),
            max_procs: self.max_procs,
            max_nodes: self.max_nodes,
            malformed: self.malformed.clone(),
            dropped: self.dropped,
        }
    }

    /// The machine size: `procs` if given, else MaxProcs, else MaxNodes.
    pub fn machine_procs(&self, procs: Option<u64>) -> Option<u64> {
        procs
            .or(self.max_procs)
            .or(self.max_nodes)
            .filter(|p| *p > 0)
    }
}

/// Why a trace cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SwfError {
    #[error("line {line}: field {field} ({name}) is {value:?}, not a number")]
    NotANumber {
        line: usize,
        field: usize,
        name: &'static str,
        value: String,
    },
}

const NAMES: [&str; 18] = [
    "job number",
    "submit time",
    "wait time",
    "run time",
    "allocated processors",
    "average cpu time",
    "used memory",
    "requested processors",
    "requested time",
    "requested memory",
    "status",
    "user id",
    "group id",
    "executable",
    "queue",
    "partition",
    "preceding job",
    "think time",
];

/// Puts the first words of a line in `fields`; how many there were (at most 18).
fn fill<'a>(fields: &mut [&'a str; 18], words: impl Iterator<Item = &'a str>) -> usize {
    let mut found = 0;
    for (slot, word) in fields.iter_mut().zip(words) {
        *slot = word;
        found += 1;
    }
    found
}

/// The 18 fields of a line made of plain integers (`-?[0-9]+`, at most 18 digits, so no
/// overflow) separated by ASCII blanks, as traces are written; `None` for anything else
/// (a comment, a real, a sign `+`, other whitespace, fewer fields), which
/// [`parse`] reads the general way with the same result. Parsing every field through
/// `str::parse` was 2,300 instructions a line, a twentieth of replaying a 100,000-job trace.
fn plain_fields(line: &[u8]) -> Option<[i64; 18]> {
    let blank = |b: u8| matches!(b, b' ' | b'\t' | b'\r' | b'\x0c');
    let mut v = [0i64; 18];
    let mut found = 0;
    let mut i = 0;
    let n = line.len();
    loop {
        while i < n && blank(line[i]) {
            i += 1;
        }
        if i == n {
            break;
        }
        let negative = line[i] == b'-';
        i += usize::from(negative);
        let digits_from = i;
        let mut value: i64 = 0;
        while i < n && line[i].is_ascii_digit() {
            if i - digits_from == 18 {
                return None;
            }
            value = value * 10 + i64::from(line[i] - b'0');
            i += 1;
        }
        // No digits, or a byte that is neither a digit nor a blank: no plain integer.
        if i == digits_from || (i < n && !blank(line[i])) {
            return None;
        }
        if found < 18 {
            v[found] = if negative { -value } else { value };
        }
        found += 1;
    }
    (found >= 18).then_some(v)
}

/// Parses a whole trace. Lines with fewer than 18 fields are recorded as malformed and
/// skipped; a field that is not a number is an error naming the line and field.
pub fn parse(text: &str) -> Result<Trace, SwfError> {
    parse_lines(text, true)
}

/// [`parse`], reading plain lines through [`plain_fields`] when `plain_first`: without it,
/// the general reading the tests compare it with.
fn parse_lines(text: &str, plain_first: bool) -> Result<Trace, SwfError> {
    let mut trace = Trace::default();
    for (n, line) in text.lines().enumerate() {
        let line_no = n + 1;
        if let Some(v) = plain_first.then(|| plain_fields(line.as_bytes())).flatten() {
            trace.add(&v);
            continue;
        }
        // Split as ASCII where that gives the same fields (the Unicode-aware trim and split
        // were over a quarter of reading a trace); a line with other whitespace (vertical
        // tab, no-break space, ...) is split as before.
        let plain = line.is_ascii() && !line.contains('\x0b');
        let line = if plain {
            line.trim_ascii()
        } else {
            line.trim()
        };
        if line.is_empty() {
            continue;
        }
        if let Some(comment) = line.strip_prefix(';') {
            let mut kv = comment.splitn(2, ':');
            let (key, value) = (
                kv.next().unwrap_or("").trim(),
                kv.next().unwrap_or("").trim(),
            );
            let number = value.split_whitespace().next().and_then(|v| v.parse().ok());
            match key {
                "MaxProcs" => trace.max_procs = number,
                "MaxNodes" => trace.max_nodes = number,
                _ => {}
            }
            continue;
        }
        // The first 18 fields, without collecting each line's fields in a `Vec` (three
        // reallocations a line were a third of reading a 100,000-job trace).
        let mut fields = [""; 18];
        let found = if plain {
            fill(&mut fields, line.split_ascii_whitespace())
        } else {
            fill(&mut fields, line.split_whitespace())
        };
        if found < 18 {
            trace.malformed.push(line_no);
            continue;
        }
        let mut v = [0i64; 18];
        for (i, f) in fields.iter().enumerate() {
            // Some archives write reals (average cpu time); only the integer part is used.
            let parsed = f.parse::<i64>().ok().or_else(|| {
                f.parse::<f64>()
                    .ok()
                    .filter(|x| x.is_finite())
                    .map(|x| x as i64)
            });
            v[i] = parsed.ok_or_else(|| SwfError::NotANumber {
                line: line_no,
                field: i + 1,
                name: NAMES[i],
                value: (*f).to_owned(),
            })?;
        }
        trace.add(&v);
    }
    Ok(trace)
}

impl Trace {
    /// The job of a line's fields, or one more dropped.
    fn add(&mut self, v: &[i64; 18]) {
        let procs = if v[7] > 0 { v[7] } else { v[4] };
        let runtime = v[3];
        let estimate = if v[8] > 0 { v[8] } else { runtime };
        if runtime < 0 || procs <= 0 || v[1] < 0 {
            self.dropped += 1;
            return;
        }
        self.jobs.push(SwfJob {
            id: u64::try_from(v[0]).unwrap_or(0),
            submit: v[1] as u64,
            runtime: runtime.min(estimate) as u64,
            procs: procs as u64,
            estimate: estimate as u64,
            user: v[11],
            group: v[12],
            queue: v[14],
            partition: v[15],
        });
    }
}

impl fmt::Display for SwfJob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "job {} (submit {} s, {} procs, {} s of {} s)",
            self.id, self.submit, self.procs, self.runtime, self.estimate
        )
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// A field as traces write it, or one the plain reading must hand over.
    fn field() -> impl Strategy<Value = String> {
        prop_oneof![
            8 => plain_field(),
            1 => Just("+5".to_owned()),
            1 => Just("12.5".to_owned()),
            1 => Just("1e3".to_owned()),
            1 => Just("-".to_owned()),
            1 => Just("x".to_owned()),
            1 => Just(";".to_owned()),
            1 => Just("9999999999999999999".to_owned()),
            1 => Just("99999999999999999999".to_owned()),
            1 => Just("NaN".to_owned()),
        ]
    }

    fn blank() -> impl Strategy<Value = &'static str> {
        prop_oneof![8 => Just(" "), 1 => Just("\t"), 1 => Just("  "), 1 => Just("\r"),
            1 => Just("\x0c"), 1 => Just("\x0b"), 1 => Just("\u{a0}")]
    }

    /// Fields, each followed by its blank, after a leading blank.
    fn joined(lead: &str, fields: &[(String, &str)]) -> String {
        let body: String = fields.iter().map(|(f, b)| format!("{f}{b}")).collect();
        format!("{lead}{body}")
    }

    fn line() -> impl Strategy<Value = String> {
        (
            blank(),
            prop::collection::vec((field(), blank()), 15..21),
            any::<bool>(),
        )
            .prop_map(|(lead, fields, comment)| {
                joined(if comment { "; MaxProcs: " } else { lead }, &fields)
            })
    }

    /// A field the plain reading takes: an integer as traces write it, or an edge of one.
    fn plain_field() -> impl Strategy<Value = String> {
        prop_oneof![
            6 => (-2i64..100_000).prop_map(|x| x.to_string()),
            1 => Just("-0".to_owned()),
            1 => Just("007".to_owned()),
            1 => Just("999999999999999999".to_owned()),
            1 => Just("-999999999999999999".to_owned()),
            1 => (0i64..1_000_000_000_000_000_000).prop_map(|x| x.to_string()),
        ]
    }

    fn ascii_blank() -> impl Strategy<Value = &'static str> {
        prop_oneof![8 => Just(" "), 1 => Just("\t"), 1 => Just("   "), 1 => Just("\r"),
            1 => Just("\x0c")]
    }

    /// A line of plain integers and ASCII blanks: read the fast way when it has 18 fields.
    fn plain_line() -> impl Strategy<Value = String> {
        (
            ascii_blank(),
            prop::collection::vec((plain_field(), ascii_blank()), 16..21),
        )
            .prop_map(|(lead, fields)| joined(lead, &fields))
    }

    proptest! {
        /// Lines of every kind, read with the fast way first and without it, give the same
        /// jobs, drops, malformed lines and errors (mostly lines the fast way hands over).
        #[test]
        fn any_line_reads_as_the_general_reading_does(
            lines in prop::collection::vec(line(), 1..8),
        ) {
            let text = lines.join("\n");
            prop_assert_eq!(parse_lines(&text, true), parse_lines(&text, false));
        }

        /// Lines the fast way takes (every one with 18 fields or more) give what the general
        /// reading gives.
        #[test]
        fn plain_lines_read_as_the_general_reading_does(
            lines in prop::collection::vec(plain_line(), 1..8),
        ) {
            for line in &lines {
                let fields = line.split_ascii_whitespace().count();
                prop_assert_eq!(plain_fields(line.as_bytes()).is_some(), fields >= 18, "{:?}", line);
            }
            let text = lines.join("\n");
            let general = parse_lines(&text, false);
            prop_assert!(general.is_ok());
            prop_assert_eq!(parse_lines(&text, true), general);
        }
    }

    #[test]
    fn plain_fields_take_integers_and_hand_over_the_rest() {
        let row = "1 0 5 100 4 -1 -1 8 50 -1 1 3 2 -1 1 -1 -1 -1";
        let v = plain_fields(row.as_bytes()).unwrap();
        assert_eq!((v[0], v[3], v[5], v[17]), (1, 100, -1, -1));
        assert_eq!(plain_fields(format!("  {row}\t ").as_bytes()), Some(v));
        // Extra fields are ignored, as the general reading ignores them.
        assert_eq!(plain_fields(format!("{row} 7 x").as_bytes()), None);
        assert_eq!(plain_fields(format!("{row} 7 8").as_bytes()), Some(v));
        for odd in ["1.5", "+1", "-", "1-", "x", "1\x0b", "1234567890123456789"] {
            let line = row.replacen("100", odd, 1);
            assert_eq!(plain_fields(line.as_bytes()), None, "{line}");
        }
        assert_eq!(plain_fields(b"1 2 3"), None);
        assert_eq!(plain_fields(b""), None);
    }

    #[test]
    fn fields_follow_the_conventions() {
        let text = "; MaxNodes: 128\n; MaxProcs: 64\n\
            1 0 5 100 4 -1 -1 8 50 -1 1 3 2 -1 1 -1 -1 -1\n\
            2 10 -1 30 4 -1 -1 -1 -1 -1 1 3 2 -1 1 -1 -1 -1\n\
            3 20 -1 -1 4 -1 -1 -1 -1 -1 1 3 2 -1 1 -1 -1 -1\n\
            4 20 -1 10 0 -1 -1 -1 -1 -1 1 3 2 -1 1 -1 -1 -1\n\
            short line\n";
        let t = parse(text).unwrap();
        assert_eq!(t.machine_procs(None), Some(64));
        assert_eq!(t.machine_procs(Some(32)), Some(32));
        assert_eq!(t.jobs.len(), 2, "no runtime, no procs: dropped");
        assert_eq!(t.dropped, 2);
        // Requested procs win; runtime capped at the requested time.
        assert_eq!(
            (t.jobs[0].procs, t.jobs[0].runtime, t.jobs[0].estimate),
            (8, 50, 50)
        );
        // No request: allocated procs, estimate = runtime.
        assert_eq!(
            (t.jobs[1].procs, t.jobs[1].runtime, t.jobs[1].estimate),
            (4, 30, 30)
        );
        assert_eq!(t.malformed, vec![7]);
    }

    /// Whitespace other than ASCII's (a vertical tab, a no-break space) still separates and
    /// trims fields, as `str::split_whitespace` does.
    #[test]
    fn unicode_whitespace_still_separates_fields() {
        let fields = "1 0 5 100 4 -1 -1 4 200 -1 1 7 3 -1 1 1 -1 -1";
        let plain = parse(&format!("; MaxProcs: 8\n{fields}\n")).unwrap();
        let odd = format!(
            "\u{b}; MaxProcs: 8\n{}\u{a0}\n\u{b}\n",
            fields.replace(' ', "\u{a0}\u{b}")
        );
        let odd = parse(&odd).unwrap();
        assert_eq!(odd.max_procs, Some(8));
        assert_eq!(odd.jobs, plain.jobs);
        assert!(odd.malformed.is_empty());
    }

    #[test]
    fn a_bad_number_names_the_line_and_field() {
        let err = parse("1 0 5 x 4 -1 -1 8 50 -1 1 3 2 -1 1 -1 -1 -1\n").unwrap_err();
        assert_eq!(
            err.to_string(),
            "line 1: field 4 (run time) is \"x\", not a number"
        );
    }
}

//! Slurm hostlists: `n[001-004,010],login1` for a list of node names.
//!
//! Admins write nodes this way in the config (`Nodes = "n[001-128]"`), and users' scripts
//! and MPI launchers read `SLURM_JOB_NODELIST` in it. Both directions are written here, with
//! Slurm's rule for padding (a range is as wide as its lower bound when that has a leading
//! zero: `n[0999-1000]` is n0999 and n1000; `hostlist-parser` 0.1 gets this wrong), and the
//! size is bounded before anything is expanded (a short expression can name billions).

use std::collections::BTreeMap;

/// The most names one expression may expand to.
pub const MAX_HOSTS: u64 = 1 << 20;

/// The most bytes of names one expression may expand to, bounded before expanding from each
/// item's number of names and length (no name is longer than its item plus the digits its
/// ranges add): `rack[1-2]-rack[1-2]-...` is short but multiplies its length.
pub const MAX_NAME_BYTES: u64 = 64 << 20;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostlistError {
    #[error("{0:?} is not a hostlist (expected names like n[001-004,010],login1)")]
    Syntax(String),
    #[error("{expr:?} names {count} hosts; at most {max} are allowed")]
    TooMany { expr: String, count: u64, max: u64 },
    #[error(
        "{expr:?} names {count} hosts in up to {bytes} bytes of names; at most {max} bytes are allowed"
    )]
    TooLong {
        expr: String,
        count: u64,
        bytes: u64,
        max: u64,
    },
}

/// Expands a hostlist into names, in the order written.
pub fn expand(expr: &str) -> Result<Vec<String>, HostlistError> {
    let count = upper_bound(expr).ok_or_else(|| HostlistError::Syntax(expr.to_string()))?;
    if count > MAX_HOSTS {
        return Err(HostlistError::TooMany {
            expr: expr.to_string(),
            count,
            max: MAX_HOSTS,
        });
    }
    // A name is no longer than its item plus 20 digits for each of the item's ranges.
    let bytes = top_level_items(expr)
        .unwrap_or_default()
        .iter()
        .map(|item| {
            let names = upper_bound(item).unwrap_or(0);
            let groups = item.matches('[').count() as u64;
            names.saturating_mul((item.len() as u64).saturating_add(groups.saturating_mul(20)))
        })
        .fold(0u64, u64::saturating_add);
    if bytes > MAX_NAME_BYTES {
        return Err(HostlistError::TooLong {
            expr: expr.to_string(),
            count,
            bytes,
            max: MAX_NAME_BYTES,
        });
    }
    let syntax = || HostlistError::Syntax(expr.to_string());
    let mut out = Vec::new();
    for item in top_level_items(expr).ok_or_else(syntax)? {
        if item.is_empty() {
            return Err(syntax());
        }
        // Each bracket group multiplies the names made so far.
        let mut names = vec![String::new()];
        let mut rest = item;
        while let Some(open) = rest.find('[') {
            let (literal, tail) = rest.split_at(open);
            let close = tail.find(']').ok_or_else(syntax)?;
            let numbers = group_numbers(&tail[1..close]).ok_or_else(syntax)?;
            names = names
                .iter()
                .flat_map(|n| numbers.iter().map(move |x| format!("{n}{literal}{x}")))
                .collect();
            rest = &tail[close + 1..];
        }
        if rest.contains(']') {
            return Err(syntax());
        }
        out.extend(names.into_iter().map(|n| n + rest));
    }
    Ok(out)
}

/// The comma-separated items of an expression, commas inside brackets kept; `None` for
/// nested or unbalanced brackets.
fn top_level_items(expr: &str) -> Option<Vec<&str>> {
    let mut items = Vec::new();
    let (mut depth, mut start) = (0u8, 0);
    for (i, c) in expr.char_indices() {
        match c {
            '[' if depth == 0 => depth = 1,
            ']' if depth == 1 => depth = 0,
            '[' | ']' => return None,
            ',' if depth == 0 => {
                items.push(&expr[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    (depth == 0).then(|| {
        items.push(&expr[start..]);
        items
    })
}

/// The numbers of one bracket group (`001-003,010`), written as the names will carry them.
fn group_numbers(group: &str) -> Option<Vec<String>> {
    let digits = |s: &str| !s.is_empty() && s.len() <= 18 && s.bytes().all(|b| b.is_ascii_digit());
    let mut out = Vec::new();
    for part in group.split(',') {
        let part = part.trim();
        match part.split_once('-') {
            Some((lo, hi)) => {
                let (lo, hi) = (lo.trim(), hi.trim());
                if !digits(lo) || !digits(hi) {
                    return None;
                }
                let (a, b): (u64, u64) = (lo.parse().ok()?, hi.parse().ok()?);
                if a > b {
                    return None;
                }
                let width = if lo.len() > 1 && lo.starts_with('0') {
                    lo.len()
                } else {
                    0
                };
                out.extend((a..=b).map(|n| format!("{n:0width$}")));
            }
            None if digits(part) => out.push(part.to_owned()),
            None => return None,
        }
    }
    Some(out)
}

/// How many names `expr` expands to at most (`None` when brackets or ranges are malformed),
/// computed without expanding: per top-level item, the product of its bracket groups' sizes.
fn upper_bound(expr: &str) -> Option<u64> {
    let mut total: u64 = 0;
    let mut item: u64 = 1;
    let mut chars = expr.chars();
    while let Some(c) = chars.next() {
        match c {
            '[' => {
                let mut group = String::new();
                loop {
                    match chars.next()? {
                        ']' => break,
                        '[' => return None,
                        c => group.push(c),
                    }
                }
                let mut size: u64 = 0;
                for part in group.split(',') {
                    let n = match part.split_once('-') {
                        Some((a, b)) => {
                            let (a, b): (u64, u64) =
                                (a.trim().parse().ok()?, b.trim().parse().ok()?);
                            a.abs_diff(b) + 1
                        }
                        None => {
                            part.trim().parse::<u64>().ok()?;
                            1
                        }
                    };
                    size = size.saturating_add(n);
                }
                item = item.saturating_mul(size);
            }
            ']' => return None,
            ',' => {
                total = total.saturating_add(item);
                item = 1;
            }
            _ => {}
        }
    }
    Some(total.saturating_add(item))
}

/// Compresses names into Slurm's form: names that differ only in a trailing number share
/// brackets (`n001,n002,n003,n007` → `n[001-003,007]`, `n9,n10` → `n[9-10]`); zero-padded
/// numbers group by their width. Groups follow the first appearance of each prefix;
/// numbers are sorted within a group.
pub fn compress<S: AsRef<str>>(names: &[S]) -> String {
    // (prefix, digit width) -> numbers; a name without a trailing number stands alone.
    let mut order: Vec<(String, usize)> = Vec::new();
    let mut groups: BTreeMap<(String, usize), Vec<u64>> = BTreeMap::new();
    for name in names {
        let name = name.as_ref();
        let digits = name.len() - name.trim_end_matches(|c: char| c.is_ascii_digit()).len();
        let (prefix, number) = name.split_at(name.len() - digits);
        let key = match number.parse::<u64>() {
            Ok(n) if digits <= 18 => {
                // Width 0: not padded, any number of digits.
                let width = if number.starts_with('0') && digits > 1 {
                    digits
                } else {
                    0
                };
                let key = (prefix.to_string(), width);
                groups.entry(key.clone()).or_default().push(n);
                key
            }
            _ => (name.to_string(), usize::MAX),
        };
        if !order.contains(&key) {
            order.push(key);
        }
    }
    // An unpadded number as wide as a padded group of its prefix belongs to that group
    // (`n08,n09,n10` is `n[08-10]`).
    let padded: Vec<(String, usize)> = groups.keys().filter(|k| k.1 > 0).cloned().collect();
    for (prefix, width) in padded {
        let unpadded = (prefix.clone(), 0);
        let Some(free) = groups.get_mut(&unpadded) else {
            continue;
        };
        let (moved, kept): (Vec<u64>, Vec<u64>) = free
            .iter()
            .partition(|n| n.checked_ilog10().map_or(1, |l| l as usize + 1) == width);
        *free = kept;
        if free.is_empty() {
            groups.remove(&unpadded);
        }
        if let Some(group) = groups.get_mut(&(prefix, width)) {
            group.extend(moved);
        }
    }
    let mut out: Vec<String> = Vec::new();
    for key in order {
        let (prefix, width) = &key;
        if *width == usize::MAX {
            out.push(prefix.clone());
            continue;
        }
        let Some(numbers) = groups.get_mut(&key) else {
            continue; // merged into a padded group
        };
        numbers.sort_unstable();
        numbers.dedup();
        if numbers.len() == 1 {
            out.push(format!("{prefix}{:0width$}", numbers[0]));
            continue;
        }
        let mut ranges: Vec<String> = Vec::new();
        let mut i = 0;
        while i < numbers.len() {
            let mut j = i;
            while j + 1 < numbers.len() && numbers[j + 1] == numbers[j] + 1 {
                j += 1;
            }
            ranges.push(if i == j {
                format!("{:0width$}", numbers[i])
            } else {
                format!("{:0width$}-{:0width$}", numbers[i], numbers[j])
            });
            i = j + 1;
        }
        out.push(format!("{prefix}[{}]", ranges.join(",")));
    }
    out.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expands_ranges_lists_and_padding() {
        assert_eq!(
            expand("n[001-003,010],login1").unwrap(),
            vec!["n001", "n002", "n003", "n010", "login1"]
        );
        assert_eq!(expand("a1").unwrap(), vec!["a1"]);
        // Slurm pads a range to its lower bound's width when that has a leading zero.
        assert_eq!(expand("n[0999-1000]").unwrap(), vec!["n0999", "n1000"]);
        assert_eq!(expand("n[9-10]").unwrap(), vec!["n9", "n10"]);
        assert_eq!(
            expand("r[1-2]c[08-09]").unwrap(),
            vec!["r1c08", "r1c09", "r2c08", "r2c09"]
        );
        assert_eq!(expand("n[1-2]-ib").unwrap(), vec!["n1-ib", "n2-ib"]);
    }

    #[test]
    fn refuses_malformed_and_absurd_lists() {
        for bad in [
            "n[1-", "n]1[", "n[a-b]", "n[[1]]", "", "a,,b", "n[3-1]", "n[]", "n[1-]", "n[-1]",
            "n[1]]",
        ] {
            assert!(
                matches!(expand(bad), Err(HostlistError::Syntax(_))),
                "{bad}"
            );
        }
        let e = expand("n[1-999999999]").unwrap_err();
        assert!(e.to_string().contains("at most 1048576"), "{e}");
        let e = expand("a[1-2000]b[1-2000]").unwrap_err();
        assert!(
            matches!(
                e,
                HostlistError::TooMany {
                    count: 4_000_000,
                    ..
                }
            ),
            "{e}"
        );
        // Few names, but each as long as a long expression: bounded in bytes too.
        let long = format!("{}n[01-16]", "rack[1-2]-".repeat(15));
        let e = expand(&long).unwrap_err();
        assert!(
            matches!(e, HostlistError::TooLong { count: 524_288, .. }),
            "{e}"
        );
        // A million short names is fine, and so are many racks of a hundred nodes each
        // (the bound is per item, not the whole expression's length per name).
        assert_eq!(expand("n[0000001-1000000]").unwrap().len(), 1_000_000);
        let racks: Vec<String> = (0..150).map(|r| format!("r{r:03}n[001-100]")).collect();
        assert_eq!(expand(&racks.join(",")).unwrap().len(), 15_000);
    }

    #[test]
    fn compresses_as_slurm_prints() {
        assert_eq!(
            compress(&["n001", "n002", "n003", "n007"]),
            "n[001-003,007]"
        );
        assert_eq!(compress(&["n1"]), "n1");
        assert_eq!(compress(&["login", "n2", "n1"]), "login,n[1-2]");
        assert_eq!(compress(&["n9", "n10"]), "n[9-10]");
        assert_eq!(compress(&["n08", "n09", "n10", "n100"]), "n[08-10],n100");
        let names: Vec<String> = expand("gpu[01-04],cpu[001-100]").unwrap();
        assert_eq!(compress(&names), "gpu[01-04],cpu[001-100]");
    }

    proptest::proptest! {
        /// Any non-empty set of names survives compress then expand: the same names, none
        /// added (an empty list is not a hostlist; `expand("")` is refused).
        #[test]
        fn compress_then_expand_gives_the_names_back(
            parts in proptest::collection::vec(
                (0usize..4, 0u64..3000, 0usize..5),
                1..200,
            )
        ) {
            let prefixes = ["n", "gpu", "rack-a", "login"];
            let names: std::collections::BTreeSet<String> = parts
                .iter()
                .map(|&(p, n, w)| format!("{}{n:0w$}", prefixes[p]))
                .collect();
            let names: Vec<String> = names.into_iter().collect();
            let text = compress(&names);
            let back: std::collections::BTreeSet<String> =
                expand(&text).unwrap().into_iter().collect();
            let want: std::collections::BTreeSet<String> = names.iter().cloned().collect();
            proptest::prop_assert_eq!(back, want, "{}", text);
        }
    }
}

//! Reading the Prometheus text format back, strictly: what a scraper would
//! accept and a little more (every sample's family must have a `# TYPE`,
//! samples of a family must be together, no sample twice). Used to gather
//! several servers' pages into one ([`merge`]) and by the tests that check
//! a server's page.

use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;

use crate::text::{escape_value, format_f64, valid_label, valid_name};

/// A family: its `# TYPE`, `# HELP` and samples, in page order.
#[derive(Debug, Clone, PartialEq)]
pub struct Family {
    pub name: String,
    /// `counter`, `gauge`, `histogram`, `summary` or `untyped`.
    pub kind: String,
    pub help: Option<String>,
    pub samples: Vec<Sample>,
}

/// One sample line.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
    pub timestamp: Option<i64>,
}

impl Sample {
    /// The value of label `k`, if the sample has it.
    pub fn label(&self, k: &str) -> Option<&str> {
        self.labels.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str())
    }
}

/// Why a page is not valid text format; `line` counts from 1.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("line {line}: {why}")]
pub struct ParseError {
    pub line: usize,
    pub why: String,
}

const KINDS: [&str; 5] = ["counter", "gauge", "histogram", "summary", "untyped"];

/// The family a sample named `name` belongs to, among `typed`.
fn family_of(name: &str, typed: &BTreeMap<String, usize>, families: &[Family]) -> Option<usize> {
    if let Some(&i) = typed.get(name) {
        return Some(i);
    }
    for suffix in ["_bucket", "_sum", "_count"] {
        if let Some(base) = name.strip_suffix(suffix) {
            if let Some(&i) = typed.get(base) {
                if matches!(families[i].kind.as_str(), "histogram" | "summary") {
                    return Some(i);
                }
            }
        }
    }
    None
}

/// Parses a page.
pub fn parse(page: &str) -> Result<Vec<Family>, ParseError> {
    let mut families: Vec<Family> = Vec::new();
    let mut typed: BTreeMap<String, usize> = BTreeMap::new();
    let mut helps: BTreeMap<String, String> = BTreeMap::new();
    let mut seen: HashSet<(String, Vec<(String, String)>)> = HashSet::new();
    // The family whose samples are being read; one that ended is closed.
    let mut current: Option<usize> = None;
    let mut closed: HashSet<usize> = HashSet::new();
    for (n, line) in page.lines().enumerate() {
        let err = |why: String| ParseError { line: n + 1, why };
        if line.trim().is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix('#') {
            let rest = rest.trim_start();
            let mut words = rest.splitn(3, ' ');
            match (words.next(), words.next(), words.next()) {
                (Some("TYPE"), Some(name), Some(kind)) => {
                    let kind = kind.trim();
                    if !valid_name(name) {
                        return Err(err(format!("TYPE of an invalid name {name:?}")));
                    }
                    if !KINDS.contains(&kind) {
                        return Err(err(format!("unknown type {kind:?} of {name}")));
                    }
                    if typed.contains_key(name) {
                        return Err(err(format!("a second TYPE line for {name}")));
                    }
                    if let Some(c) = current.take() {
                        closed.insert(c);
                    }
                    typed.insert(name.to_string(), families.len());
                    families.push(Family {
                        name: name.to_string(),
                        kind: kind.to_string(),
                        help: helps.remove(name),
                        samples: Vec::new(),
                    });
                    current = Some(families.len() - 1);
                }
                (Some("HELP"), Some(name), help) => {
                    let help = unescape_help(help.unwrap_or(""));
                    match typed.get(name) {
                        Some(&i) if families[i].help.is_some() => {
                            return Err(err(format!("a second HELP line for {name}")))
                        }
                        Some(&i) => families[i].help = Some(help),
                        None => {
                            if helps.insert(name.to_string(), help).is_some() {
                                return Err(err(format!("a second HELP line for {name}")));
                            }
                        }
                    }
                }
                // Any other comment.
                _ => {}
            }
            continue;
        }
        let sample = parse_sample(line).map_err(err)?;
        let Some(i) = family_of(&sample.name, &typed, &families) else {
            return Err(err(format!("sample of {} has no TYPE line before it", sample.name)));
        };
        if closed.contains(&i) || current.is_some_and(|c| c != i) {
            return Err(err(format!("samples of {} are not together", families[i].name)));
        }
        current = Some(i);
        if !seen.insert((sample.name.clone(), sample.labels.clone())) {
            return Err(err(format!("{} with the same labels twice", sample.name)));
        }
        families[i].samples.push(sample);
    }
    Ok(families)
}

fn unescape_help(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match (c, c == '\\') {
            (_, true) => match chars.next() {
                Some('n') => out.push('\n'),
                Some(o) => out.push(o),
                None => out.push('\\'),
            },
            (c, false) => out.push(c),
        }
    }
    out
}

fn parse_value(v: &str) -> Option<f64> {
    match v {
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        "NaN" => Some(f64::NAN),
        v => v.parse().ok(),
    }
}

/// `name{k="v",...} value [timestamp]`.
fn parse_sample(line: &str) -> Result<Sample, String> {
    let end = line.find(['{', ' ', '\t']).ok_or_else(|| format!("{line:?} is not `name value`"))?;
    let name = &line[..end];
    if !valid_name(name) {
        return Err(format!("invalid metric name {name:?}"));
    }
    let mut rest = &line[end..];
    let mut labels = Vec::new();
    if let Some(r) = rest.strip_prefix('{') {
        let mut chars = r.char_indices().peekable();
        loop {
            // Label name up to '=', or the closing brace.
            let start = match chars.peek() {
                Some(&(i, '}')) => {
                    rest = &r[i + 1..];
                    break;
                }
                Some(&(i, _)) => i,
                None => return Err("labels not closed".into()),
            };
            let eq = r[start..].find('=').ok_or("a label without `=`")? + start;
            let key = r[start..eq].trim();
            if !valid_label(key) {
                return Err(format!("invalid label name {key:?}"));
            }
            while chars.peek().is_some_and(|&(i, _)| i <= eq) {
                chars.next();
            }
            if chars.next().map(|(_, c)| c) != Some('"') {
                return Err(format!("the value of label {key} is not quoted"));
            }
            let mut value = String::new();
            loop {
                match chars.next() {
                    Some((_, '\\')) => match chars.next() {
                        Some((_, 'n')) => value.push('\n'),
                        Some((_, '\\')) => value.push('\\'),
                        Some((_, '"')) => value.push('"'),
                        other => return Err(format!("bad escape in label {key}: {other:?}")),
                    },
                    Some((_, '"')) => break,
                    Some((_, c)) => value.push(c),
                    None => return Err(format!("the value of label {key} is not closed")),
                }
            }
            if labels.iter().any(|(k, _): &(String, String)| k == key) {
                return Err(format!("label {key} twice"));
            }
            labels.push((key.to_string(), value));
            match chars.next() {
                Some((_, ',')) => {}
                Some((i, '}')) => {
                    rest = &r[i + 1..];
                    break;
                }
                other => return Err(format!("expected `,` or `}}` after label {key}, found {other:?}")),
            }
        }
    }
    if !rest.starts_with([' ', '\t']) {
        return Err(format!("no space before the value of {name}"));
    }
    let mut words = rest.split_whitespace();
    let v = words.next().ok_or_else(|| format!("{name} has no value"))?;
    let value = parse_value(v).ok_or_else(|| format!("{name}: {v:?} is not a number"))?;
    let timestamp = match words.next() {
        Some(t) => Some(t.parse::<i64>().map_err(|_| format!("{name}: timestamp {t:?} is not an integer"))?),
        None => None,
    };
    if let Some(extra) = words.next() {
        return Err(format!("{name}: unexpected {extra:?} after the value"));
    }
    Ok(Sample { name: name.to_string(), labels, value, timestamp })
}

/// Several pages as one: each family once (its first HELP and TYPE), with
/// the samples of every page (which differ by their `server` label). Pages
/// that type one name differently, or repeat a sample, are refused.
pub fn merge(pages: &[&str]) -> Result<String, (usize, ParseError)> {
    let mut order: Vec<String> = Vec::new();
    let mut by_name: BTreeMap<String, Family> = BTreeMap::new();
    for (p, page) in pages.iter().enumerate() {
        for f in parse(page).map_err(|e| (p, e))? {
            match by_name.get_mut(&f.name) {
                Some(g) if g.kind != f.kind => {
                    return Err((
                        p,
                        ParseError { line: 0, why: format!("{} is a {} here, a {} before", f.name, f.kind, g.kind) },
                    ))
                }
                Some(g) => g.samples.extend(f.samples),
                None => {
                    order.push(f.name.clone());
                    by_name.insert(f.name.clone(), f);
                }
            }
        }
    }
    let mut out = String::new();
    for name in order {
        let f = &by_name[&name];
        if let Some(h) = &f.help {
            let _ = writeln!(out, "# HELP {name} {}", h.replace('\\', "\\\\").replace('\n', "\\n"));
        }
        let _ = writeln!(out, "# TYPE {name} {}", f.kind);
        for s in &f.samples {
            out.push_str(&s.name);
            if !s.labels.is_empty() {
                let l: Vec<String> = s.labels.iter().map(|(k, v)| format!("{k}=\"{}\"", escape_value(v))).collect();
                let _ = write!(out, "{{{}}}", l.join(","));
            }
            let _ = write!(out, " {}", format_f64(s.value));
            if let Some(t) = s.timestamp {
                let _ = write!(out, " {t}");
            }
            out.push('\n');
        }
    }
    parse(&out).map_err(|e| (pages.len(), e))?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_valid_page_parses() {
        let page = "# HELP a_total A.\n# TYPE a_total counter\na_total{op=\"read\",} 1\na_total{op=\"write\"} 2 17\n\
                    # some comment\n\n# TYPE h histogram\nh_bucket{le=\"+Inf\"} 3\nh_sum 1e3\nh_count 3\n\
                    # TYPE g gauge\ng -Inf\n";
        let f = parse(page).unwrap();
        assert_eq!(f.len(), 3);
        assert_eq!(f[0].help.as_deref(), Some("A."));
        assert_eq!(f[0].samples[1].timestamp, Some(17));
        assert_eq!(f[0].samples[0].label("op"), Some("read"));
        assert_eq!(f[1].samples.len(), 3);
        assert_eq!(f[2].samples[0].value, f64::NEG_INFINITY);
    }

    #[test]
    fn invalid_pages_are_refused_with_the_line() {
        let bad = [
            ("a 1\n", 1, "no TYPE"),
            ("# TYPE a gauge\na{x=\"1\" 1\n", 2, "expected"),
            ("# TYPE a gauge\na{x=1} 1\n", 2, "not quoted"),
            ("# TYPE a gauge\na one\n", 2, "not a number"),
            ("# TYPE a gauge\na\n", 2, "not `name value`"),
            ("# TYPE a gauge\n# TYPE b gauge\nb 1\na 1\n", 4, "not together"),
            ("# TYPE a gauge\na 1\na 2\n", 3, "twice"),
            ("# TYPE a gauge\n# TYPE a gauge\n", 2, "second TYPE"),
            ("# TYPE a meter\n", 1, "unknown type"),
            ("# TYPE a gauge\na{x=\"1\",x=\"2\"} 1\n", 2, "label x twice"),
            ("# TYPE a gauge\na{x=\"\\q\"} 1\n", 2, "bad escape"),
            ("# TYPE a gauge\na 1 2 3\n", 2, "unexpected"),
            ("# TYPE a gauge\n# TYPE a_count gauge\na_count 1\n", 0, ""),
        ];
        for (page, line, why) in bad {
            match parse(page) {
                Err(e) => {
                    assert_eq!(e.line, line, "{page:?}: {e}");
                    assert!(e.why.contains(why), "{page:?}: {e}");
                }
                // `a_count` of a gauge `a` is its own family here: valid.
                Ok(_) => assert_eq!(line, 0, "{page:?} parsed"),
            }
        }
    }

    #[test]
    fn pages_merge_into_one_valid_page() {
        let a = "# HELP r_total R.\n# TYPE r_total counter\nr_total{server=\"a\"} 1\n# TYPE only_a gauge\nonly_a 1\n";
        let b = "# HELP r_total R.\n# TYPE r_total counter\nr_total{server=\"b\"} 2\n";
        let m = merge(&[a, b]).unwrap();
        assert_eq!(
            m,
            "# HELP r_total R.\n# TYPE r_total counter\nr_total{server=\"a\"} 1\nr_total{server=\"b\"} 2\n\
             # TYPE only_a gauge\nonly_a 1\n"
        );
        // The same sample twice (two servers with one name) is refused.
        assert!(merge(&[a, a]).is_err());
        let c = "# TYPE r_total gauge\nr_total{server=\"c\"} 2\n";
        assert_eq!(merge(&[a, c]).unwrap_err().0, 1);
    }
}

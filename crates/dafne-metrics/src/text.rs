//! Writing the Prometheus text format, version 0.0.4
//! (<https://prometheus.io/docs/instrumenting/exposition_formats/>).
//!
//! A page is a list of families; each has one `# HELP` and one `# TYPE`
//! line followed by all its samples, which is what the format requires
//! (a family's samples may not be split). Counters are named `…_total`;
//! the writer refuses (panics in debug builds on) names the format does not
//! allow, since every name here is a constant of dafne's code. Label
//! values are escaped (`\\`, `\"`, `\n`), so any value is safe.

use std::collections::BTreeSet;
use std::fmt::Write as _;

/// The content type of the page.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A family's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up (until the process restarts); named `…_total`.
    Counter,
    /// Goes up and down (bytes held now, connections now).
    Gauge,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
        }
    }
}

/// A page being written.
#[derive(Debug)]
pub struct Text {
    out: String,
    /// Labels every sample carries (`server="io-1"`), already formatted.
    common: String,
    families: BTreeSet<String>,
}

/// One family being written: add its samples.
#[derive(Debug)]
pub struct Family<'a> {
    text: &'a mut Text,
    name: String,
}

/// Whether `name` is a valid metric name (`[a-zA-Z_:][a-zA-Z0-9_:]*`).
pub fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// Whether `name` is a valid label name (`[a-zA-Z_][a-zA-Z0-9_]*`).
pub fn valid_label(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// A label value as it stands between the quotes.
pub fn escape_value(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// A `# HELP` text: backslashes and line feeds escaped.
fn escape_help(v: &str) -> String {
    v.replace('\\', "\\\\").replace('\n', "\\n")
}

/// A float as the format writes it (`+Inf`, `-Inf`, `NaN`).
pub fn format_f64(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v == f64::INFINITY {
        "+Inf".into()
    } else if v == f64::NEG_INFINITY {
        "-Inf".into()
    } else {
        format!("{v}")
    }
}

fn labels_into(out: &mut String, labels: &[(&str, &str)]) {
    for (i, (k, v)) in labels.iter().enumerate() {
        debug_assert!(valid_label(k), "label name {k:?}");
        if i > 0 {
            out.push(',');
        }
        let _ = write!(out, "{k}=\"{}\"", escape_value(v));
    }
}

impl Text {
    /// A page whose every sample carries `common` labels.
    pub fn new(common: &[(&str, &str)]) -> Text {
        let mut c = String::new();
        labels_into(&mut c, common);
        Text { out: String::new(), common: c, families: BTreeSet::new() }
    }

    /// Starts the family `name`. A family already written is continued
    /// only by the same `Family`; starting it twice is a bug (debug panic;
    /// release: its samples follow a second header, which parsers refuse,
    /// so tests catch it).
    pub fn family(&mut self, name: &str, kind: Kind, help: &str) -> Family<'_> {
        debug_assert!(valid_name(name), "metric name {name:?}");
        debug_assert!(kind != Kind::Counter || name.ends_with("_total"), "counter {name:?} must end in _total");
        let fresh = self.families.insert(name.to_string());
        debug_assert!(fresh, "family {name:?} written twice");
        let _ = writeln!(self.out, "# HELP {name} {}", escape_help(help));
        let _ = writeln!(self.out, "# TYPE {name} {}", kind.name());
        Family { text: self, name: name.to_string() }
    }

    /// A family of one sample without labels of its own.
    pub fn single(&mut self, name: &str, kind: Kind, help: &str, value: u64) {
        self.family(name, kind, help).sample(&[], value);
    }

    /// The page.
    pub fn finish(self) -> String {
        self.out
    }
}

impl Family<'_> {
    /// A sample with these labels (besides the page's common ones).
    pub fn sample(&mut self, labels: &[(&str, &str)], value: u64) -> &mut Self {
        self.write(labels, &value.to_string())
    }

    pub fn sample_f64(&mut self, labels: &[(&str, &str)], value: f64) -> &mut Self {
        self.write(labels, &format_f64(value))
    }

    fn write(&mut self, labels: &[(&str, &str)], value: &str) -> &mut Self {
        let t = &mut *self.text;
        t.out.push_str(&self.name);
        if !t.common.is_empty() || !labels.is_empty() {
            t.out.push('{');
            t.out.push_str(&t.common);
            if !t.common.is_empty() && !labels.is_empty() {
                t.out.push(',');
            }
            labels_into(&mut t.out, labels);
            t.out.push('}');
        }
        t.out.push(' ');
        t.out.push_str(value);
        t.out.push('\n');
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_has_help_type_and_labelled_samples() {
        let mut t = Text::new(&[("server", "io-1")]);
        t.family("dafne_io_requests_total", Kind::Counter, "Requests.\nBy op \\ kind.")
            .sample(&[("op", "read")], 3)
            .sample(&[("op", "write")], u64::MAX);
        t.single("dafne_io_dirty_bytes", Kind::Gauge, "Dirty.", 0);
        t.family("process_cpu_seconds_total", Kind::Counter, "CPU.").sample_f64(&[], 1.5);
        let page = t.finish();
        assert_eq!(
            page,
            "# HELP dafne_io_requests_total Requests.\\nBy op \\\\ kind.\n\
             # TYPE dafne_io_requests_total counter\n\
             dafne_io_requests_total{server=\"io-1\",op=\"read\"} 3\n\
             dafne_io_requests_total{server=\"io-1\",op=\"write\"} 18446744073709551615\n\
             # HELP dafne_io_dirty_bytes Dirty.\n\
             # TYPE dafne_io_dirty_bytes gauge\n\
             dafne_io_dirty_bytes{server=\"io-1\"} 0\n\
             # HELP process_cpu_seconds_total CPU.\n\
             # TYPE process_cpu_seconds_total counter\n\
             process_cpu_seconds_total{server=\"io-1\"} 1.5\n"
        );
        let parsed = crate::parse(&page).unwrap();
        assert_eq!(parsed.len(), 3);
        assert_eq!(parsed[0].samples[1].value, u64::MAX as f64);
    }

    #[test]
    fn label_values_are_escaped_and_parse_back() {
        let mut t = Text::new(&[("server", "a\"b\\c\nd")]);
        t.single("x", Kind::Gauge, "x", 1);
        let page = t.finish();
        assert!(page.contains(r#"x{server="a\"b\\c\nd"} 1"#), "{page}");
        let f = crate::parse(&page).unwrap();
        assert_eq!(f[0].samples[0].labels, vec![("server".to_string(), "a\"b\\c\nd".to_string())]);
    }

    #[test]
    fn names_and_floats() {
        assert!(valid_name("dafne_io_requests_total") && valid_name(":a") && !valid_name("9a") && !valid_name("a-b"));
        assert!(valid_label("op") && !valid_label(":op") && !valid_label(""));
        assert_eq!(format_f64(f64::INFINITY), "+Inf");
        assert_eq!(format_f64(f64::NAN), "NaN");
        assert_eq!(format_f64(0.25), "0.25");
        // No labels at all: no braces.
        let mut t = Text::new(&[]);
        t.single("up", Kind::Gauge, "Up.", 1);
        assert!(t.finish().ends_with("\nup 1\n"));
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "must end in _total")]
    fn a_counter_without_total_is_a_bug() {
        Text::new(&[]).family("dafne_requests", Kind::Counter, "x");
    }
}

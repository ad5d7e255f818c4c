//! Prometheus' text exposition format (version 0.0.4), for `linnet daemon
//! --metrics`: families of samples, each with its help, type and labels,
//! written as Prometheus reads them. The daemon's metrics are snapshots it
//! takes at each scrape (the kernel's counters, its own), so they are plain
//! values here rather than instruments updated in place.

use std::fmt::Write;
use std::time::Duration;

/// What kind of metric a family is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// One metric's samples, by labels.
#[derive(Debug, Clone)]
pub struct Family {
    pub name: &'static str,
    pub help: &'static str,
    pub kind: Kind,
    samples: Vec<Sample>,
}

#[derive(Debug, Clone)]
struct Sample {
    /// After the family's name: `_bucket`, `_sum`, `_count` or nothing.
    suffix: &'static str,
    labels: Vec<(&'static str, String)>,
    value: f64,
}

impl Family {
    pub fn new(name: &'static str, kind: Kind, help: &'static str) -> Family {
        Family {
            name,
            help,
            kind,
            samples: Vec::new(),
        }
    }

    /// A sample with these labels.
    pub fn add(&mut self, labels: &[(&'static str, &str)], value: f64) -> &mut Family {
        self.samples.push(Sample {
            suffix: "",
            labels: owned(labels),
            value,
        });
        self
    }

    /// A histogram's buckets, sum and count, with these labels.
    pub fn add_histogram(
        &mut self,
        labels: &[(&'static str, &str)],
        histogram: &Histogram,
    ) -> &mut Family {
        let mut cumulative = 0;
        for (bound, count) in histogram.bounds.iter().zip(&histogram.counts) {
            cumulative += count;
            let mut labels = owned(labels);
            labels.push(("le", number(*bound)));
            self.samples.push(Sample {
                suffix: "_bucket",
                labels,
                value: cumulative as f64,
            });
        }
        let mut labels_inf = owned(labels);
        labels_inf.push(("le", "+Inf".into()));
        let total = histogram.count();
        self.samples.push(Sample {
            suffix: "_bucket",
            labels: labels_inf,
            value: total as f64,
        });
        self.samples.push(Sample {
            suffix: "_sum",
            labels: owned(labels),
            value: histogram.sum,
        });
        self.samples.push(Sample {
            suffix: "_count",
            labels: owned(labels),
            value: total as f64,
        });
        self
    }
}

fn owned(labels: &[(&'static str, &str)]) -> Vec<(&'static str, String)> {
    labels.iter().map(|(k, v)| (*k, v.to_string())).collect()
}

/// A count of observations in buckets of upper bounds (seconds, say).
#[derive(Debug, Clone, PartialEq)]
pub struct Histogram {
    bounds: &'static [f64],
    /// Per bucket (not cumulative); the last is above every bound.
    counts: Vec<u64>,
    sum: f64,
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            counts: vec![0; bounds.len() + 1],
            sum: 0.0,
        }
    }

    pub fn observe(&mut self, value: f64) {
        let at = (self.bounds.iter())
            .position(|b| value <= *b)
            .unwrap_or(self.bounds.len());
        self.counts[at] += 1;
        self.sum += value;
    }

    pub fn observe_duration(&mut self, d: Duration) {
        self.observe(d.as_secs_f64());
    }

    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }
}

/// A number as Prometheus writes it.
fn number(v: f64) -> String {
    if v.is_infinite() {
        return if v > 0.0 { "+Inf" } else { "-Inf" }.into();
    }
    if v.is_nan() {
        return "NaN".into();
    }
    if v.fract() == 0.0 && v.abs() < 1e15 {
        return format!("{}", v as i64);
    }
    format!("{v}")
}

/// A label's value between quotes: backslash, quote and newline escaped.
fn escape(value: &str, out: &mut String) {
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// The families in the text format; a family without samples is left out.
pub fn render(families: &[Family]) -> String {
    let mut out = String::new();
    for family in families.iter().filter(|f| !f.samples.is_empty()) {
        // Help text is linnet's own, one line, without backslashes.
        let _ = writeln!(out, "# HELP {} {}", family.name, family.help);
        let _ = writeln!(out, "# TYPE {} {}", family.name, family.kind.as_str());
        for sample in &family.samples {
            out.push_str(family.name);
            out.push_str(sample.suffix);
            if !sample.labels.is_empty() {
                out.push('{');
                for (i, (key, value)) in sample.labels.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(key);
                    out.push_str("=\"");
                    escape(value, &mut out);
                    out.push('"');
                }
                out.push('}');
            }
            let _ = writeln!(out, " {}", number(sample.value));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_render_with_help_type_and_escaped_labels() {
        let mut bytes = Family::new(
            "linnet_vm_sent_bytes_total",
            Kind::Counter,
            "Bytes the VM sent.",
        );
        bytes
            .add(&[("network", "shared"), ("name", "a\"b\\c\nd")], 1234.0)
            .add(&[("network", "host"), ("name", "")], 0.0);
        let empty = Family::new("linnet_nothing", Kind::Gauge, "Nothing.");
        let mut up = Family::new("linnet_up", Kind::Gauge, "Always 1.");
        up.add(&[], 1.0);
        assert_eq!(
            render(&[bytes, empty, up]),
            "# HELP linnet_vm_sent_bytes_total Bytes the VM sent.\n\
             # TYPE linnet_vm_sent_bytes_total counter\n\
             linnet_vm_sent_bytes_total{network=\"shared\",name=\"a\\\"b\\\\c\\nd\"} 1234\n\
             linnet_vm_sent_bytes_total{network=\"host\",name=\"\"} 0\n\
             # HELP linnet_up Always 1.\n\
             # TYPE linnet_up gauge\n\
             linnet_up 1\n"
        );
    }

    #[test]
    fn a_histogram_is_cumulative_buckets_a_sum_and_a_count() {
        static BOUNDS: [f64; 3] = [0.01, 0.1, 1.0];
        let mut h = Histogram::new(&BOUNDS);
        for v in [0.005, 0.05, 0.05, 3.0] {
            h.observe(v);
        }
        let mut f = Family::new("linnet_attach_seconds", Kind::Histogram, "Attaches.");
        f.add_histogram(&[], &h);
        let text = render(&[f]);
        for line in [
            "linnet_attach_seconds_bucket{le=\"0.01\"} 1",
            "linnet_attach_seconds_bucket{le=\"0.1\"} 3",
            "linnet_attach_seconds_bucket{le=\"1\"} 3",
            "linnet_attach_seconds_bucket{le=\"+Inf\"} 4",
            "linnet_attach_seconds_sum 3.105",
            "linnet_attach_seconds_count 4",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
    }
}

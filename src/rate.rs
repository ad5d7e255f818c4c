//! Rate limits as users write them: `--rate-limit 100mbit` (each way),
//! `--rate-limit-in` (what the VM receives) and `--rate-limit-out` (what it
//! sends), with an optional burst, `100mbit/512kb`. The kernel enforces
//! them (`host::guard`): a token bucket per way that drops what exceeds
//! the rate, which TCP in the VM and its peers answer by slowing down.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use thiserror::Error;

#[derive(Debug, Error, PartialEq)]
#[error("\"{spec}\": {problem} (expected RATE[/BURST], e.g. 100mbit, 1gbit or 20mbit/256kb)")]
pub struct RateSpecError {
    spec: String,
    problem: String,
}

/// The slowest rate linnet takes: below it a single full-size frame waits
/// seconds for its tokens.
pub const MIN_BITS_PER_SECOND: u64 = 64_000;
/// The fastest: beyond what one port moves anyway.
pub const MAX_BITS_PER_SECOND: u64 = 400_000_000_000;
/// The least burst: a TAP carries frames of up to 64 KiB (TCP segments the
/// VMM or kernel cuts later), and a frame larger than the bucket never
/// passes at all.
pub const MIN_BURST_BYTES: u64 = 128 << 10;
/// How long the rate runs when a burst is not given: enough for TCP to
/// keep the rate (measured within 3% at 10 Mbit/s to 1 Gbit/s through a
/// bridge; a smaller bucket loses more to TCP's backing off).
pub const DEFAULT_BURST_MILLIS: u64 = 20;
/// The largest burst: a second at the fastest rate.
pub const MAX_BURST_BYTES: u64 = MAX_BITS_PER_SECOND / 8;

/// One way's limit: a rate and the bucket that lets short bursts above it
/// through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rate {
    pub bits_per_second: u64,
    /// As given, if it was: `burst_bytes` says what holds.
    pub burst: Option<u64>,
}

impl Rate {
    /// The rate in bytes per second, as the kernel counts it.
    pub fn bytes_per_second(&self) -> u64 {
        self.bits_per_second / 8
    }

    /// The bucket: as given, or `DEFAULT_BURST_MILLIS` of the rate, never
    /// less than `MIN_BURST_BYTES`.
    pub fn burst_bytes(&self) -> u64 {
        self.burst.unwrap_or_else(|| {
            (self.bytes_per_second() * DEFAULT_BURST_MILLIS / 1000).max(MIN_BURST_BYTES)
        })
    }
}

/// An interface's limits, each way: `received` is what reaches the VM,
/// `sent` what it sends (to anyone: other VMs, the host, the world).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RateLimits {
    #[serde(default, rename = "in", skip_serializing_if = "Option::is_none")]
    pub received: Option<Rate>,
    #[serde(default, rename = "out", skip_serializing_if = "Option::is_none")]
    pub sent: Option<Rate>,
}

impl RateLimits {
    /// The same limit each way.
    pub fn both(rate: Rate) -> RateLimits {
        RateLimits {
            received: Some(rate),
            sent: Some(rate),
        }
    }

    pub fn is_none(&self) -> bool {
        self.received.is_none() && self.sent.is_none()
    }

    /// From the command line's three options: `--rate-limit` for both
    /// ways, `--rate-limit-in`/`-out` for one (and over `--rate-limit`).
    pub fn from_options(both: Option<Rate>, received: Option<Rate>, sent: Option<Rate>) -> Self {
        RateLimits {
            received: received.or(both),
            sent: sent.or(both),
        }
    }

    /// `self`, with `default`'s way where it has none.
    pub fn or(self, default: RateLimits) -> RateLimits {
        RateLimits {
            received: self.received.or(default.received),
            sent: self.sent.or(default.sent),
        }
    }
}

impl fmt::Display for RateLimits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let way = |r: Option<Rate>| r.map_or("unlimited".to_string(), |r| r.to_string());
        match (self.received, self.sent) {
            (None, None) => f.write_str("none"),
            (a, b) if a == b => write!(f, "{} each way", way(a)),
            (a, b) => write!(f, "in {}, out {}", way(a), way(b)),
        }
    }
}

/// Bits: `bit`, `kbit`, `mbit`, `gbit` (powers of 1000, as tc and link
/// speeds count).
const RATE_UNITS: [(&str, u64); 4] = [
    ("gbit", 1_000_000_000),
    ("mbit", 1_000_000),
    ("kbit", 1_000),
    ("bit", 1),
];

/// Bytes: `b`, `kb`/`mb` (1000s) and `kib`/`mib` (1024s).
const BURST_UNITS: [(&str, u64); 5] = [
    ("kib", 1 << 10),
    ("mib", 1 << 20),
    ("kb", 1_000),
    ("mb", 1_000_000),
    ("b", 1),
];

/// `NUMBER UNIT` with the unit one of `units` (longest names first).
fn amount(text: &str, units: &[(&str, u64)], what: &str) -> Result<u64, String> {
    let lower = text.trim().to_ascii_lowercase();
    let (number, scale) = units
        .iter()
        .find_map(|(unit, scale)| Some((lower.strip_suffix(unit)?, *scale)))
        .ok_or_else(|| {
            let names: Vec<&str> = units.iter().map(|(u, _)| *u).collect();
            format!(
                "{what} \"{text}\" needs a unit: one of {}",
                names.join(", ")
            )
        })?;
    let number: f64 = number
        .trim()
        .parse()
        .ok()
        .filter(|n: &f64| n.is_finite() && *n > 0.0)
        .ok_or_else(|| format!("{what} \"{text}\" is not a positive number and a unit"))?;
    let value = number * scale as f64;
    if value >= u64::MAX as f64 {
        return Err(format!("{what} \"{text}\" is too large"));
    }
    Ok(value as u64)
}

fn bits(n: u64) -> String {
    match RATE_UNITS.iter().find(|(_, s)| n.is_multiple_of(*s)) {
        Some((unit, scale)) => format!("{}{unit}", n / scale),
        None => format!("{n}bit"),
    }
}

fn bytes(n: u64) -> String {
    match BURST_UNITS.iter().find(|(_, s)| n.is_multiple_of(*s)) {
        Some((unit, scale)) => format!("{}{unit}", n / scale),
        None => format!("{n}b"),
    }
}

impl FromStr for Rate {
    type Err = RateSpecError;

    fn from_str(spec: &str) -> Result<Rate, RateSpecError> {
        let fail = |problem: String| RateSpecError {
            spec: spec.into(),
            problem,
        };
        let (rate, burst) = match spec.split_once('/') {
            Some((rate, burst)) => (rate, Some(burst)),
            None => (spec, None),
        };
        let bits_per_second = amount(rate, &RATE_UNITS, "rate").map_err(fail)?;
        if !(MIN_BITS_PER_SECOND..=MAX_BITS_PER_SECOND).contains(&bits_per_second) {
            return Err(fail(format!(
                "the rate must be from {} to {}",
                bits(MIN_BITS_PER_SECOND),
                bits(MAX_BITS_PER_SECOND)
            )));
        }
        let burst = burst
            .map(|b| amount(b, &BURST_UNITS, "burst"))
            .transpose()
            .map_err(fail)?;
        if let Some(b) = burst
            && !(MIN_BURST_BYTES..=MAX_BURST_BYTES).contains(&b)
        {
            return Err(fail(format!(
                "the burst must be from {} (a TAP's largest frame, 64 KiB, must fit twice) to {}",
                bytes(MIN_BURST_BYTES),
                bytes(MAX_BURST_BYTES)
            )));
        }
        Ok(Rate {
            bits_per_second,
            burst,
        })
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&bits(self.bits_per_second))?;
        match self.burst {
            Some(b) => write!(f, "/{}", bytes(b)),
            None => Ok(()),
        }
    }
}

/// In JSON and YAML as its text, `"100mbit/256kib"`.
impl Serialize for Rate {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Rate {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rate(text: &str) -> Rate {
        text.parse().unwrap()
    }

    #[test]
    fn rates_are_bits_with_tcs_units_and_bursts_bytes() {
        assert_eq!(rate("100mbit").bits_per_second, 100_000_000);
        assert_eq!(rate("1.5Gbit").bits_per_second, 1_500_000_000);
        assert_eq!(rate("64kbit").bits_per_second, 64_000);
        let r = rate("20mbit/256kib");
        assert_eq!((r.bits_per_second, r.burst), (20_000_000, Some(256 << 10)));
        assert_eq!(rate("20mbit/1mb").burst, Some(1_000_000));
        assert_eq!(rate("100mbit").to_string(), "100mbit");
        assert_eq!(rate("20mbit/256kib").to_string(), "20mbit/256kib");
        assert_eq!(rate("1500kbit").to_string(), "1500kbit");
    }

    #[test]
    fn the_burst_is_20_ms_of_the_rate_but_never_less_than_two_large_frames() {
        assert_eq!(rate("1gbit").burst_bytes(), 2_500_000);
        assert_eq!(rate("10mbit").burst_bytes(), MIN_BURST_BYTES);
        assert_eq!(rate("10mbit/1mb").burst_bytes(), 1_000_000);
    }

    #[test]
    fn a_rate_without_a_unit_or_out_of_bounds_is_refused_saying_what_fits() {
        for (spec, says) in [
            ("100", "needs a unit"),
            ("100mb", "needs a unit"),
            ("fast", "needs a unit"),
            ("-3mbit", "not a positive number"),
            ("0mbit", "not a positive number"),
            ("10kbit", "from 64kbit to 400gbit"),
            ("1000gbit", "from 64kbit to 400gbit"),
            ("10mbit/1kb", "the burst must be from 128kib"),
            ("10mbit/abc", "burst \"abc\" needs a unit"),
        ] {
            let err = spec.parse::<Rate>().unwrap_err().to_string();
            assert!(err.contains(says), "{spec}: {err}");
            assert!(err.contains("expected RATE[/BURST]"), "{err}");
        }
    }

    #[test]
    fn limits_read_and_write_as_a_way_each_and_the_options_combine() {
        let both = RateLimits::from_options(Some(rate("10mbit")), None, Some(rate("1mbit")));
        assert_eq!(both.received, Some(rate("10mbit")));
        assert_eq!(both.sent, Some(rate("1mbit")));
        assert_eq!(both.to_string(), "in 10mbit, out 1mbit");
        let json = serde_json::to_value(both).unwrap();
        assert_eq!(json, serde_json::json!({"in": "10mbit", "out": "1mbit"}));
        assert_eq!(serde_json::from_value::<RateLimits>(json).unwrap(), both);
        assert_eq!(
            RateLimits::both(rate("5mbit")).to_string(),
            "5mbit each way"
        );
        let none = RateLimits::default();
        assert!(none.is_none());
        assert_eq!(serde_json::to_value(none).unwrap(), serde_json::json!({}));
        assert_eq!(none.or(both), both);
        assert_eq!(
            serde_json::from_str::<RateLimits>(r#"{"in": "3mbit"}"#)
                .unwrap()
                .sent,
            None
        );
        assert!(serde_json::from_str::<RateLimits>(r#"{"in": "3"}"#).is_err());
    }
}

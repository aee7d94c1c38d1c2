//! A file's redundancy policy (docs/erasure-coding.md §1): how its chunks are written, what
//! they become once sealed, and whether they are compressed.
//!
//! Text form, as `cairn fs create --policy` takes it and `cairn fs stat` shows it:
//! `replicas:N`, `ec:K+M`, `replicas:N,then:ec:K+M`, each optionally followed by `,lz4`.

use serde::{Deserialize, Serialize};
use std::fmt;

/// How one layout of a chunk keeps its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Redundancy {
    /// N full copies on N servers.
    Replicas(u8),
    /// K data cells and M parity cells per stripe, on K+M servers.
    Ec { k: u8, m: u8 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Policy {
    /// How appends are written.
    pub write: Redundancy,
    /// What sealed chunks are converted to in the background (always EC).
    pub then: Option<Redundancy>,
    /// LZ4 per block.
    pub lz4: bool,
}

/// Bounds a policy must keep.
pub const MAX_REPLICAS: u8 = 9;
pub const MIN_EC_DATA: u8 = 2;
pub const MAX_EC_WIDTH: u8 = 32;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "bad policy {text:?}: {why} (expected replicas:N, ec:K+M or replicas:N,then:ec:K+M, optionally ,lz4)"
)]
pub struct PolicyError {
    pub text: String,
    pub why: String,
}

impl Default for Policy {
    /// Three replicas, uncompressed: what every file had before policies.
    fn default() -> Self {
        Self {
            write: Redundancy::Replicas(3),
            then: None,
            lz4: false,
        }
    }
}

impl Redundancy {
    /// Servers one chunk (group) occupies.
    pub fn width(&self) -> usize {
        match *self {
            Redundancy::Replicas(n) => n as usize,
            Redundancy::Ec { k, m } => (k + m) as usize,
        }
    }

    /// Lost servers a chunk survives.
    pub fn tolerates(&self) -> usize {
        match *self {
            Redundancy::Replicas(n) => n as usize - 1,
            Redundancy::Ec { m, .. } => m as usize,
        }
    }

    /// Bytes stored per user byte (full stripes).
    pub fn overhead(&self) -> f64 {
        match *self {
            Redundancy::Replicas(n) => f64::from(n),
            Redundancy::Ec { k, m } => f64::from(k + m) / f64::from(k),
        }
    }

    fn parse(s: &str) -> Result<Self, String> {
        if let Some(n) = s.strip_prefix("replicas:") {
            let n: u8 = n
                .parse()
                .map_err(|_| format!("{n:?} is not a replica count"))?;
            if !(1..=MAX_REPLICAS).contains(&n) {
                return Err(format!("replicas must be 1 to {MAX_REPLICAS}"));
            }
            return Ok(Redundancy::Replicas(n));
        }
        if let Some(km) = s.strip_prefix("ec:") {
            let (k, m) = km
                .split_once('+')
                .ok_or_else(|| format!("{km:?} is not K+M"))?;
            let k: u8 = k
                .parse()
                .map_err(|_| format!("{k:?} is not a cell count"))?;
            let m: u8 = m
                .parse()
                .map_err(|_| format!("{m:?} is not a cell count"))?;
            if k < MIN_EC_DATA || m == 0 || u16::from(k) + u16::from(m) > u16::from(MAX_EC_WIDTH) {
                return Err(format!(
                    "EC needs K ≥ {MIN_EC_DATA}, M ≥ 1 and K+M ≤ {MAX_EC_WIDTH}"
                ));
            }
            return Ok(Redundancy::Ec { k, m });
        }
        Err(format!("unknown item {s:?}"))
    }
}

impl fmt::Display for Redundancy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Redundancy::Replicas(n) => write!(f, "replicas:{n}"),
            Redundancy::Ec { k, m } => write!(f, "ec:{k}+{m}"),
        }
    }
}

impl Policy {
    /// The layout chunks have once everything is done (converted, if the policy converts).
    pub fn at_rest(&self) -> Redundancy {
        self.then.unwrap_or(self.write)
    }

    /// The most servers any layout of the policy needs at once.
    pub fn width(&self) -> usize {
        self.write.width().max(self.then.map_or(0, |t| t.width()))
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.write)?;
        if let Some(t) = self.then {
            write!(f, ",then:{t}")?;
        }
        if self.lz4 {
            write!(f, ",lz4")?;
        }
        Ok(())
    }
}

impl std::str::FromStr for Policy {
    type Err = PolicyError;

    fn from_str(text: &str) -> Result<Self, PolicyError> {
        let err = |why: String| PolicyError {
            text: text.to_owned(),
            why,
        };
        let mut items = text.split(',').map(str::trim);
        let write = Redundancy::parse(items.next().unwrap_or_default()).map_err(err)?;
        let mut p = Policy {
            write,
            then: None,
            lz4: false,
        };
        for item in items {
            if item == "lz4" && !p.lz4 {
                p.lz4 = true;
            } else if let Some(t) = item.strip_prefix("then:") {
                if p.then.is_some() || p.lz4 {
                    return Err(err(format!("{item:?} out of place")));
                }
                let t = Redundancy::parse(t).map_err(err)?;
                if !matches!(
                    (p.write, t),
                    (Redundancy::Replicas(_), Redundancy::Ec { .. })
                ) {
                    return Err(err("only replicas convert, and only to ec".into()));
                }
                p.then = Some(t);
            } else {
                return Err(err(format!("unknown or repeated item {item:?}")));
            }
        }
        Ok(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_the_same_text() {
        for s in [
            "replicas:3",
            "replicas:1",
            "ec:4+2",
            "ec:6+3",
            "ec:8+3",
            "ec:4+2,lz4",
            "replicas:3,then:ec:8+3",
            "replicas:3,then:ec:4+2,lz4",
        ] {
            let p: Policy = s.parse().unwrap();
            assert_eq!(p.to_string(), s);
        }
        let p: Policy = "replicas:3,then:ec:4+2".parse().unwrap();
        assert_eq!(p.at_rest(), Redundancy::Ec { k: 4, m: 2 });
        assert_eq!(p.width(), 6);
        assert_eq!(Policy::default().to_string(), "replicas:3");
        assert!((Redundancy::Ec { k: 4, m: 2 }.overhead() - 1.5).abs() < 1e-9);
    }

    #[test]
    fn refuses_what_it_cannot_mean() {
        for s in [
            "",
            "replicas",
            "replicas:0",
            "replicas:10",
            "ec:4",
            "ec:1+1",
            "ec:4+0",
            "ec:30+3",
            "ec:4+2,then:ec:8+3",
            "replicas:3,then:replicas:2",
            "replicas:3,lz4,lz4",
            "replicas:3,lz4,then:ec:4+2",
            "replicas:3,zstd",
            "raid5",
        ] {
            assert!(s.parse::<Policy>().is_err(), "{s:?} accepted");
        }
    }
}

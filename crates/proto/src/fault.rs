//! The payload of a FAULT request (docs/formats/wire.md, "Fault injection"): what a chunkserver
//! started with `--fault-injection` does wrong from now on.

/// Bytes of an encoded [`FaultSpec`].
pub const FAULT_BYTES: usize = 24;

const STALL: u32 = 1;
const DISK_FULL: u32 = 2;
const DISK_ONLY: u32 = 4;
const KNOWN: u32 = STALL | DISK_FULL | DISK_ONLY;

/// Faults of one chunkserver. The default is no fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct FaultSpec {
    /// Every affected request waits this long before it is served.
    pub delay_ms: u32,
    /// Plus a uniformly random extra wait in `[0, jitter_ms]`.
    pub jitter_ms: u32,
    /// Affected requests fail with IO ("injected fault") with this probability, in parts per
    /// million.
    pub error_ppm: u32,
    /// Affected requests are held (never answered) until the fault is cleared: a frozen server.
    pub stall: bool,
    /// Creates and appends fail with NO_SPACE.
    pub disk_full: bool,
    /// Only requests that reach a disk (create, append, read, seal, delete) are affected; stat
    /// and ping are served normally (a sick disk behind a healthy process).
    pub disk_only: bool,
}

/// A FAULT payload that does not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FaultError {
    #[error("fault payload of {0} bytes; it is {FAULT_BYTES}")]
    Length(usize),
    #[error("error rate {0} ppm is above 1000000")]
    Rate(u32),
    #[error("unknown fault flags {0:#x}")]
    Flags(u32),
    #[error("non-zero reserved bytes in a fault payload")]
    Reserved,
}

impl FaultSpec {
    /// True when the spec changes nothing.
    pub fn is_clear(&self) -> bool {
        *self == Self::default()
    }

    pub fn encode(&self) -> [u8; FAULT_BYTES] {
        let mut b = [0u8; FAULT_BYTES];
        b[0..4].copy_from_slice(&self.delay_ms.to_le_bytes());
        b[4..8].copy_from_slice(&self.jitter_ms.to_le_bytes());
        b[8..12].copy_from_slice(&self.error_ppm.to_le_bytes());
        let mut flags = 0;
        for (on, bit) in [
            (self.stall, STALL),
            (self.disk_full, DISK_FULL),
            (self.disk_only, DISK_ONLY),
        ] {
            if on {
                flags |= bit;
            }
        }
        b[12..16].copy_from_slice(&flags.to_le_bytes());
        b
    }

    /// Decodes a payload; the empty payload is "no fault".
    ///
    /// # Errors
    /// Wrong length, a rate above one million, unknown flags, non-zero reserved bytes.
    pub fn decode(b: &[u8]) -> Result<Self, FaultError> {
        if b.is_empty() {
            return Ok(Self::default());
        }
        let b: &[u8; FAULT_BYTES] = b.try_into().map_err(|_| FaultError::Length(b.len()))?;
        let u = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let (error_ppm, flags) = (u(8), u(12));
        if error_ppm > 1_000_000 {
            return Err(FaultError::Rate(error_ppm));
        }
        if flags & !KNOWN != 0 {
            return Err(FaultError::Flags(flags));
        }
        if b[16..].iter().any(|&x| x != 0) {
            return Err(FaultError::Reserved);
        }
        Ok(Self {
            delay_ms: u(0),
            jitter_ms: u(4),
            error_ppm,
            stall: flags & STALL != 0,
            disk_full: flags & DISK_FULL != 0,
            disk_only: flags & DISK_ONLY != 0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn round_trips(delay_ms: u32, jitter_ms: u32, error_ppm in 0u32..=1_000_000,
                       stall: bool, disk_full: bool, disk_only: bool) {
            let f = FaultSpec { delay_ms, jitter_ms, error_ppm, stall, disk_full, disk_only };
            prop_assert_eq!(FaultSpec::decode(&f.encode()).unwrap(), f);
        }
    }

    #[test]
    fn bad_payloads_are_refused() {
        assert_eq!(FaultSpec::decode(&[]).unwrap(), FaultSpec::default());
        assert_eq!(FaultSpec::decode(&[0; 5]), Err(FaultError::Length(5)));
        let mut b = FaultSpec::default().encode();
        b[8..12].copy_from_slice(&1_000_001u32.to_le_bytes());
        assert_eq!(FaultSpec::decode(&b), Err(FaultError::Rate(1_000_001)));
        let mut b = FaultSpec::default().encode();
        b[12] = 8;
        assert_eq!(FaultSpec::decode(&b), Err(FaultError::Flags(8)));
        let mut b = FaultSpec::default().encode();
        b[20] = 1;
        assert_eq!(FaultSpec::decode(&b), Err(FaultError::Reserved));
    }
}

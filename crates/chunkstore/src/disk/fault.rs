//! An in-memory device that fails the way real ones do, for tests.
//!
//! It keeps two images: *volatile* (what reads see: every completed write) and *durable* (what
//! survives a power cut: the state at the last successful sync). [`FaultDisk::crash`] produces
//! the image a power cut would leave, under a [`CrashPolicy`]: each write since the last sync
//! is lost, kept, torn at a byte, or kept as a random subset of its sectors.

use super::Disk;
use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::io;
use std::time::Duration;

/// Faults applied to every operation until changed.
#[derive(Debug, Clone, Default)]
pub struct FaultConfig {
    /// Probability that a write fails with EIO (nothing is written).
    pub write_error_rate: f64,
    /// Probability that a sync fails with EIO (nothing more becomes durable).
    pub sync_error_rate: f64,
    /// Probability that a read fails with EIO.
    pub read_error_rate: f64,
    /// Added to every operation.
    pub latency: Duration,
    /// After this many more writes and syncs succeed, every operation fails with EIO, as if
    /// power was cut at that point. `crash` then tells what survived.
    pub power_cut_after_ops: Option<u64>,
}

/// What happens to the writes that were not yet synced when power is cut.
#[derive(Debug, Clone, Copy)]
pub enum CrashPolicy {
    /// Every unsynced write is lost.
    DropAll,
    /// Every unsynced write survives.
    KeepAll,
    /// Earlier unsynced writes survive; the last one survives only up to `byte` (a tear).
    TearLast { byte: usize },
    /// Each unsynced write, independently: lost, kept, torn at a random byte, or kept as a
    /// random subset of its sectors (devices with volatile caches reorder).
    Random { seed: u64 },
}

struct State {
    volatile: Vec<u8>,
    durable: Vec<u8>,
    /// (offset, bytes) of each write since the last successful sync, in order.
    unsynced: Vec<(u64, Vec<u8>)>,
    config: FaultConfig,
    rng: StdRng,
    ops: u64,
    powered_off: bool,
}

/// The in-memory fault-injecting device.
pub struct FaultDisk {
    alignment: usize,
    state: Mutex<State>,
}

impl FaultDisk {
    /// A zeroed device of `capacity` bytes.
    pub fn new(capacity: u64, alignment: usize, seed: u64) -> Self {
        Self::from_image(vec![0; capacity as usize], alignment, seed)
    }

    /// A device whose durable and visible contents are `image` (e.g. from [`FaultDisk::crash`]).
    pub fn from_image(image: Vec<u8>, alignment: usize, seed: u64) -> Self {
        assert!(alignment.is_power_of_two());
        Self {
            alignment,
            state: Mutex::new(State {
                durable: image.clone(),
                volatile: image,
                unsynced: Vec::new(),
                config: FaultConfig::default(),
                rng: StdRng::seed_from_u64(seed),
                ops: 0,
                powered_off: false,
            }),
        }
    }

    /// Replaces the fault configuration (and restarts the power-cut countdown).
    pub fn set_faults(&self, config: FaultConfig) {
        let mut s = self.state.lock();
        s.config = config;
        s.ops = 0;
    }

    /// Cuts power now: every later operation fails with EIO.
    pub fn power_off(&self) {
        self.state.lock().powered_off = true;
    }

    /// Whether power has been cut (by [`FaultDisk::power_off`] or the countdown).
    pub fn is_powered_off(&self) -> bool {
        self.state.lock().powered_off
    }

    /// The image a power cut at this instant leaves behind, under `policy`. The device itself
    /// is unchanged; open a new one with [`FaultDisk::from_image`].
    pub fn crash(&self, policy: CrashPolicy) -> Vec<u8> {
        let s = self.state.lock();
        let mut image = s.durable.clone();
        let n = s.unsynced.len();
        let mut rng = match policy {
            CrashPolicy::Random { seed } => Some(StdRng::seed_from_u64(seed)),
            _ => None,
        };
        for (i, (off, data)) in s.unsynced.iter().enumerate() {
            let off = *off as usize;
            match policy {
                CrashPolicy::DropAll => {}
                CrashPolicy::KeepAll => image[off..off + data.len()].copy_from_slice(data),
                CrashPolicy::TearLast { byte } => {
                    let keep = if i + 1 == n {
                        byte.min(data.len())
                    } else {
                        data.len()
                    };
                    image[off..off + keep].copy_from_slice(&data[..keep]);
                }
                CrashPolicy::Random { .. } => {
                    let rng = rng.as_mut().expect("rng");
                    match rng.random_range(0..4) {
                        0 => {}
                        1 => image[off..off + data.len()].copy_from_slice(data),
                        2 => {
                            let keep = rng.random_range(0..=data.len());
                            image[off..off + keep].copy_from_slice(&data[..keep]);
                        }
                        _ => {
                            for (k, sector) in data.chunks(self.alignment).enumerate() {
                                if rng.random_bool(0.5) {
                                    let o = off + k * self.alignment;
                                    image[o..o + sector.len()].copy_from_slice(sector);
                                }
                            }
                        }
                    }
                }
            }
        }
        image
    }

    /// Flips one bit in both images (media corruption of durable data).
    pub fn flip_bit(&self, offset: u64, bit: u8) {
        let mut s = self.state.lock();
        s.volatile[offset as usize] ^= 1 << (bit % 8);
        s.durable[offset as usize] ^= 1 << (bit % 8);
    }

    /// The visible contents (for tests that inspect the layout).
    pub fn snapshot(&self) -> Vec<u8> {
        self.state.lock().volatile.clone()
    }

    /// (offset, length) of every write since the last successful sync, in order.
    pub fn unsynced_writes(&self) -> Vec<(u64, usize)> {
        self.state
            .lock()
            .unsynced
            .iter()
            .map(|(o, d)| (*o, d.len()))
            .collect()
    }

    fn begin(&self, s: &mut State, error_rate: f64, counts: bool) -> io::Result<()> {
        if !s.config.latency.is_zero() {
            std::thread::sleep(s.config.latency);
        }
        if s.powered_off {
            return Err(eio("device powered off"));
        }
        if counts && let Some(limit) = s.config.power_cut_after_ops {
            if s.ops >= limit {
                s.powered_off = true;
                return Err(eio("power cut"));
            }
            s.ops += 1;
        }
        if error_rate > 0.0 && s.rng.random_bool(error_rate.min(1.0)) {
            return Err(eio("injected I/O error"));
        }
        Ok(())
    }

    fn check(&self, s: &State, off: u64, len: usize) -> io::Result<()> {
        if !off.is_multiple_of(self.alignment as u64) || !len.is_multiple_of(self.alignment) {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "unaligned I/O"));
        }
        if off
            .checked_add(len as u64)
            .is_none_or(|e| e > s.volatile.len() as u64)
        {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "I/O past the end of the device",
            ));
        }
        Ok(())
    }
}

fn eio(msg: &'static str) -> io::Error {
    io::Error::other(msg)
}

impl Disk for FaultDisk {
    fn capacity(&self) -> u64 {
        self.state.lock().volatile.len() as u64
    }

    fn alignment(&self) -> usize {
        self.alignment
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let mut s = self.state.lock();
        self.check(&s, offset, buf.len())?;
        let rate = s.config.read_error_rate;
        self.begin(&mut s, rate, false)?;
        let o = offset as usize;
        buf.copy_from_slice(&s.volatile[o..o + buf.len()]);
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let mut s = self.state.lock();
        self.check(&s, offset, buf.len())?;
        let rate = s.config.write_error_rate;
        self.begin(&mut s, rate, true)?;
        let o = offset as usize;
        s.volatile[o..o + buf.len()].copy_from_slice(buf);
        s.unsynced.push((offset, buf.to_vec()));
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        let mut s = self.state.lock();
        let rate = s.config.sync_error_rate;
        self.begin(&mut s, rate, true)?;
        let pending = std::mem::take(&mut s.unsynced);
        for (off, data) in pending {
            let o = off as usize;
            s.durable[o..o + data.len()].copy_from_slice(&data);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsynced_writes_are_lost_synced_survive() {
        let d = FaultDisk::new(8192, 512, 1);
        d.write_at(&[1u8; 512], 0).unwrap();
        d.sync().unwrap();
        d.write_at(&[2u8; 512], 512).unwrap();
        let img = d.crash(CrashPolicy::DropAll);
        assert!(img[..512].iter().all(|&b| b == 1));
        assert!(img[512..1024].iter().all(|&b| b == 0));
        let img = d.crash(CrashPolicy::TearLast { byte: 100 });
        assert!(img[512..612].iter().all(|&b| b == 2));
        assert!(img[612..1024].iter().all(|&b| b == 0));
    }

    #[test]
    fn power_cut_countdown() {
        let d = FaultDisk::new(8192, 512, 1);
        d.set_faults(FaultConfig {
            power_cut_after_ops: Some(1),
            ..Default::default()
        });
        d.write_at(&[1u8; 512], 0).unwrap();
        assert!(d.sync().is_err());
        assert!(d.is_powered_off());
        assert!(d.write_at(&[1u8; 512], 0).is_err());
    }
}

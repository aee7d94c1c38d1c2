//! The device under a chunk store.
//!
//! The store talks to its device only through [`Disk`]: positioned reads and writes of aligned
//! buffers, batches of writes, and a flush. [`FileDisk`] is the real one (O_DIRECT, io_uring
//! batches, fdatasync); [`FaultDisk`] is an in-memory twin that can lose unsynced writes, tear a
//! write at any byte, flip bits, fail with EIO and add latency, for the tests.

mod fault;
mod file;

pub use fault::{CrashPolicy, FaultConfig, FaultDisk};
pub use file::FileDisk;

use std::io;
use std::os::fd::RawFd;

/// Writes started by [`Disk::start_writes`], to be finished by [`Disk::finish_writes`].
#[must_use = "every started write batch must be finished"]
pub enum WriteTicket {
    /// Already done (the device wrote synchronously); the results, in order.
    Done(Vec<io::Result<()>>),
    /// In flight on the device; the device's own handle.
    Pending(u64),
}

/// How [`Disk::wait_writes`] waits.
#[derive(Debug, Clone, Copy)]
pub enum Wait {
    /// Only look.
    Poll,
    /// Until a ticket completes.
    Block,
    /// Until a ticket completes or this file descriptor (an eventfd) becomes readable.
    Doorbell(RawFd),
}

/// A block device seen by the chunk store.
///
/// Offsets, lengths and buffer addresses passed in are multiples of [`Disk::alignment`].
/// Implementations are shared between the device thread (writes, syncs) and reader threads.
pub trait Disk: Send + Sync + 'static {
    /// Usable bytes.
    fn capacity(&self) -> u64;
    /// The O_DIRECT offset alignment the device reports.
    fn alignment(&self) -> usize;
    /// Reads exactly `buf.len()` bytes at `offset`.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Writes all of `buf` at `offset`. Not durable until [`Disk::sync`] returns.
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Writes several buffers, possibly in parallel; one result per write, in order.
    fn write_batch(&self, writes: &[(u64, &[u8])]) -> Vec<io::Result<()>> {
        write_each(self, writes)
    }
    /// Starts writing several buffers and returns without waiting for them (the default
    /// writes them before returning).
    ///
    /// # Safety
    /// Every buffer must stay valid and unmodified until [`Disk::finish_writes`] has returned
    /// for the ticket, and every ticket must be finished.
    unsafe fn start_writes(&self, writes: &[(u64, &[u8])]) -> WriteTicket {
        WriteTicket::Done(self.write_batch(writes))
    }
    /// Starts a flush of every write completed so far and returns without waiting for it;
    /// [`Disk::finish_writes`] gives its one result. The default flushes before returning.
    fn start_sync(&self) -> WriteTicket {
        WriteTicket::Done(vec![self.sync()])
    }
    /// Returns the position of the first of `tickets` whose operations have all completed
    /// (so that [`Disk::finish_writes`] will not block it), waiting as `wait` says; `None`
    /// when none has (after a poll, a doorbell, or spuriously). The default (a synchronous
    /// disk, whose tickets are done when started) is the first ticket.
    fn wait_writes(&self, tickets: &[&WriteTicket], wait: Wait) -> Option<usize> {
        let _ = wait;
        (!tickets.is_empty()).then_some(0)
    }
    /// Waits for the writes of a ticket from [`Disk::start_writes`]; one result per write.
    fn finish_writes(&self, ticket: WriteTicket) -> Vec<io::Result<()>> {
        match ticket {
            WriteTicket::Done(r) => r,
            WriteTicket::Pending(_) => unreachable!("a pending ticket from a synchronous disk"),
        }
    }
    /// Reads several buffers, possibly in parallel; one result per read, in order.
    fn read_batch(&self, reads: &mut [(u64, &mut [u8])]) -> Vec<io::Result<()>> {
        read_each(self, reads)
    }
    /// Makes every completed write durable (a device cache flush).
    fn sync(&self) -> io::Result<()>;
}

/// Writes one buffer after another with [`Disk::write_at`].
fn write_each<D: Disk + ?Sized>(disk: &D, writes: &[(u64, &[u8])]) -> Vec<io::Result<()>> {
    writes
        .iter()
        .map(|(off, buf)| disk.write_at(buf, *off))
        .collect()
}

/// Reads one buffer after another with [`Disk::read_at`].
fn read_each<D: Disk + ?Sized>(disk: &D, reads: &mut [(u64, &mut [u8])]) -> Vec<io::Result<()>> {
    reads
        .iter_mut()
        .map(|(off, buf)| disk.read_at(buf, *off))
        .collect()
}

impl<D: Disk + ?Sized> Disk for std::sync::Arc<D> {
    fn capacity(&self) -> u64 {
        (**self).capacity()
    }
    fn alignment(&self) -> usize {
        (**self).alignment()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        (**self).read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        (**self).write_at(buf, offset)
    }
    fn write_batch(&self, writes: &[(u64, &[u8])]) -> Vec<io::Result<()>> {
        (**self).write_batch(writes)
    }
    fn read_batch(&self, reads: &mut [(u64, &mut [u8])]) -> Vec<io::Result<()>> {
        (**self).read_batch(reads)
    }
    unsafe fn start_writes(&self, writes: &[(u64, &[u8])]) -> WriteTicket {
        // SAFETY: the caller upholds the contract.
        unsafe { (**self).start_writes(writes) }
    }
    fn start_sync(&self) -> WriteTicket {
        (**self).start_sync()
    }
    fn wait_writes(&self, tickets: &[&WriteTicket], wait: Wait) -> Option<usize> {
        (**self).wait_writes(tickets, wait)
    }
    fn finish_writes(&self, ticket: WriteTicket) -> Vec<io::Result<()>> {
        (**self).finish_writes(ticket)
    }
    fn sync(&self) -> io::Result<()> {
        (**self).sync()
    }
}

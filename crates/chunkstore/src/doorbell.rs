//! Wakes the device thread while it waits on the device.
//!
//! The device thread waits in one of two places: on its request queue (nothing in flight),
//! or on the device (writes in flight). In the second case a new request must still wake it,
//! so that the request's writes start at once instead of after the batch in flight is done.
//! The doorbell is an eventfd the thread's write ring polls beside its writes
//! ([`crate::Disk::wait_writes`]); a sender rings it after queueing a request, but only while
//! the thread says it is parked there, so the common paths cost no system call.
//!
//! Lost wake-ups are excluded the Dekker way: the thread publishes `parked` and then looks at
//! the queue; a sender queues and then looks at `parked`. With sequentially consistent
//! fences between the store and the load on each side, at least one of them sees the other.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering, fence};

pub(crate) struct Doorbell {
    fd: Option<OwnedFd>,
    parked: AtomicBool,
}

impl Doorbell {
    /// A doorbell; without an eventfd (creation failed) it is never used and the thread waits
    /// for its writes without being woken.
    pub fn new() -> Self {
        // SAFETY: plain syscall; a non-negative result is a new fd we own.
        let raw = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        let fd = (raw >= 0).then(|| unsafe { OwnedFd::from_raw_fd(raw) });
        Self {
            fd,
            parked: AtomicBool::new(false),
        }
    }

    /// Called by a sender after it queued a request.
    pub fn ring(&self) {
        fence(Ordering::SeqCst);
        if self.parked.load(Ordering::Relaxed)
            && let Some(fd) = &self.fd
        {
            let one: u64 = 1;
            // SAFETY: writes 8 bytes from a live u64 to our eventfd. A full counter (EAGAIN)
            // already means "rung".
            unsafe { libc::write(fd.as_raw_fd(), (&raw const one).cast(), 8) };
        }
    }

    /// Called by the device thread before it waits on the device. Returns the fd to wait on,
    /// or None when the thread must not wait with a doorbell (there is none).
    /// The caller must look at its queue after this and before waiting.
    pub fn park(&self) -> Option<RawFd> {
        let fd = self.fd.as_ref()?.as_raw_fd();
        self.parked.store(true, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        Some(fd)
    }

    /// Called by the device thread after its wait; clears the eventfd.
    pub fn unpark(&self) {
        self.parked.store(false, Ordering::Relaxed);
        if let Some(fd) = &self.fd {
            let mut n: u64 = 0;
            // SAFETY: reads 8 bytes into a live u64 from our non-blocking eventfd (EAGAIN when
            // it was not rung).
            unsafe { libc::read(fd.as_raw_fd(), (&raw mut n).cast(), 8) };
        }
    }
}

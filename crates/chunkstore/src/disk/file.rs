//! The real device: one preallocated file (or block device) opened with O_DIRECT.

use super::{Disk, Wait, WriteTicket, read_each, write_each};
use crate::buf::AlignedBuf;
use io_uring::{IoUring, opcode, types};
use parking_lot::Mutex;
use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// io_uring submission-queue depth for write batches (the completion queue is twice that:
/// room for every write of the device thread's batches in flight, 4 x MAX_TICKET_WRITES).
const RING_ENTRIES: u32 = 256;
/// Most submissions in one ticket; larger batches are written in several tickets.
const MAX_TICKET_WRITES: usize = 64;
/// Most buffers in one vectored write.
const MAX_IOVECS: usize = 64;
/// user_data = ticket << TICKET_SHIFT | index of the write in its ticket.
const TICKET_SHIFT: u32 = 16;
/// user_data of the doorbell poll (no ticket reaches this number).
const DOORBELL: u64 = u64::MAX;

/// The write ring and the writes it has in flight, by ticket.
struct WriteRing {
    ring: IoUring,
    next_ticket: u64,
    tickets: std::collections::HashMap<u64, Vec<InFlightWrite>>,
    /// A ring call failed: it is never entered again (so no stale submission can reach the
    /// device), and writes are synchronous from then on.
    broken: bool,
    /// A poll of the doorbell is in the ring and has not completed.
    doorbell_armed: bool,
    /// The doorbell poll completed and no `wait_writes` has reported it yet.
    doorbell_rang: bool,
}

/// One operation of a ticket: a write, or (`len` 0, `sync`) a flush.
struct InFlightWrite {
    sync: bool,
    off: u64,
    /// The caller's buffer (kept valid by the `start_writes` contract).
    ptr: usize,
    len: usize,
    result: Option<io::Result<()>>,
    /// The first write of a run of writes to adjacent device ranges submitted as one
    /// vectored write: how many writes the run holds (its completion answers them all) and
    /// the iovecs the kernel reads (kept until then). Empty for a plain write and for the
    /// other writes of a run.
    run: usize,
    iovecs: Vec<libc::iovec>,
}

// SAFETY: the iovecs only point into the caller's buffers, like `ptr`.
unsafe impl Send for InFlightWrite {}
/// io_uring depth of each reader thread's ring (a read touches at most a few extents).
const READ_RING_ENTRIES: u32 = 8;

/// A file or block device used with O_DIRECT.
///
/// Writes in a batch go to the kernel together through io_uring (falling back to `pwrite` when
/// io_uring is not available); reads are `pread` from the caller's thread; `sync` is
/// `fdatasync`.
pub struct FileDisk {
    file: File,
    capacity: u64,
    alignment: usize,
    ring: Option<Mutex<WriteRing>>,
}

impl FileDisk {
    /// Creates `path` (it must not exist), allocates `bytes` for it and, when `zero_fill`,
    /// writes zeros over all of it.
    ///
    /// Zero-filling matters on ext4/xfs: a preallocated but never-written block is an
    /// "unwritten extent", and the first write into it makes the next fdatasync commit a
    /// journal transaction. Writing the file once at format time makes every later append an
    /// overwrite that fdatasync turns into a bare device flush.
    ///
    /// # Errors
    /// I/O errors, including `AlreadyExists` and `InvalidInput` when the filesystem refuses
    /// O_DIRECT (tmpfs).
    pub fn create(path: &Path, bytes: u64, zero_fill: bool) -> io::Result<Self> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .custom_flags(libc::O_DIRECT | libc::O_CLOEXEC)
            .open(path)?;
        // SAFETY: plain syscall on an fd we own.
        let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, bytes as libc::off_t) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        let disk = Self::from_file(file, path, Some(bytes))?;
        if zero_fill {
            let step = 8 << 20;
            let zeros = AlignedBuf::zeroed(step);
            let mut off = 0u64;
            while off < bytes {
                let n = (bytes - off).min(step as u64) as usize;
                let n = n / disk.alignment * disk.alignment;
                if n == 0 {
                    break;
                }
                disk.write_at(&zeros[..n], off)?;
                off += n as u64;
            }
            disk.sync()?;
        }
        Ok(disk)
    }

    /// Opens an existing file or block device.
    ///
    /// # Errors
    /// I/O errors; `InvalidInput` when the filesystem refuses O_DIRECT.
    pub fn open(path: &Path) -> io::Result<Self> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_DIRECT | libc::O_CLOEXEC)
            .open(path)?;
        Self::from_file(file, path, None)
    }

    fn from_file(file: File, path: &Path, capacity: Option<u64>) -> io::Result<Self> {
        lock(&file, path)?;
        let capacity = match capacity {
            Some(c) => c,
            None => device_size(&file)?,
        };
        let alignment = dio_alignment(path)?;
        let ring = match IoUring::new(RING_ENTRIES) {
            Ok(ring) => Some(Mutex::new(WriteRing {
                ring,
                next_ticket: 1,
                tickets: std::collections::HashMap::new(),
                broken: false,
                doorbell_armed: false,
                doorbell_rang: false,
            })),
            Err(e) => {
                tracing::warn!(error = %e, "io_uring unavailable; using pwrite for write batches");
                None
            }
        };
        Ok(Self {
            file,
            capacity,
            alignment,
            ring,
        })
    }

    fn fd(&self) -> i32 {
        self.file.as_raw_fd()
    }

    /// Gives up on the ring: completes every write still pending with a synchronous
    /// `pwrite`. The kernel may yet complete submitted ones, which write the same bytes.
    fn finish_synchronously(&self, r: &mut WriteRing) {
        r.broken = true;
        for entries in r.tickets.values_mut() {
            for e in entries.iter_mut().filter(|e| e.result.is_none()) {
                if e.sync {
                    e.result = Some(self.sync());
                    continue;
                }
                // SAFETY: the ticket's owner keeps the buffer valid until it is finished.
                let buf = unsafe { std::slice::from_raw_parts(e.ptr as *const u8, e.len) };
                e.result = Some(self.write_at(buf, e.off));
            }
        }
    }

    /// Hands the queued submissions to the kernel; a failed ring is given up (writes finish
    /// synchronously).
    fn submit(&self, r: &mut WriteRing) {
        loop {
            match r.ring.submit() {
                Ok(_) => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return self.finish_synchronously(r),
            }
        }
    }

    /// Takes every completion the ring holds (without waiting) and records it in its ticket.
    fn reap(&self, r: &mut WriteRing) {
        let cqes: Vec<(u64, i32)> = r
            .ring
            .completion()
            .map(|c| (c.user_data(), c.result()))
            .collect();
        for (ud, res) in cqes {
            if ud == DOORBELL {
                r.doorbell_armed = false;
                r.doorbell_rang = true;
                continue;
            }
            let (t, i) = (
                ud >> TICKET_SHIFT,
                (ud & ((1 << TICKET_SHIFT) - 1)) as usize,
            );
            let Some(v) = r.tickets.get_mut(&t) else {
                continue;
            };
            let run = v.get(i).map_or(0, |e| e.run.max(1));
            let Some(writes) = v.get_mut(i..i + run) else {
                continue;
            };
            let total: usize = writes.iter().map(|e| e.len).sum();
            if res < 0 {
                for e in writes {
                    e.result = Some(Err(io::Error::from_raw_os_error(-res)));
                }
            } else if (res as usize) < total {
                // Short write: write each buffer again, synchronously (same bytes).
                for e in writes {
                    // SAFETY: the ticket's owner keeps the buffer valid until it is finished.
                    let buf = unsafe { std::slice::from_raw_parts(e.ptr as *const u8, e.len) };
                    e.result = Some(self.write_at(buf, e.off));
                }
            } else {
                for e in writes {
                    e.result = Some(Ok(()));
                }
            }
        }
    }
}

/// Takes the file's exclusive lock: one store per file, since a second process (or a second
/// open in this one) would interleave its writes with ours. The lock goes with the file.
///
/// A process killed with writes in flight on its io_uring still holds the file for a moment
/// after it is gone (the kernel tears the ring down asynchronously), so a lock held elsewhere
/// is waited for up to [`LOCK_WAIT`] before it is an error.
fn lock(file: &File, path: &Path) -> io::Result<()> {
    let began = std::time::Instant::now();
    loop {
        // SAFETY: plain syscall on an fd the caller owns.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::WouldBlock {
            return Err(e);
        }
        if began.elapsed() >= LOCK_WAIT {
            return Err(io::Error::new(
                io::ErrorKind::ResourceBusy,
                format!(
                    "{}: the store is open elsewhere (locked for {LOCK_WAIT:?})",
                    path.display()
                ),
            ));
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// How long [`lock`] waits for a lock held elsewhere.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

fn device_size(file: &File) -> io::Result<u64> {
    let meta = file.metadata()?;
    use std::os::unix::fs::FileTypeExt;
    if meta.file_type().is_block_device() {
        // BLKGETSIZE64 = _IOR(0x12, 114, size_t)
        const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
        let mut size: u64 = 0;
        // SAFETY: ioctl writes one u64 into `size`.
        let rc = unsafe { libc::ioctl(file.as_raw_fd(), BLKGETSIZE64, &mut size) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(size)
    } else {
        Ok(meta.len())
    }
}

/// The O_DIRECT offset alignment of the file at `path`, from `statx(STATX_DIOALIGN)`.
/// Kernels or filesystems that do not report it get the conservative 4096.
pub fn dio_alignment(path: &Path) -> io::Result<usize> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: statx fills the zeroed struct; c is a valid C string.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    let rc = unsafe {
        libc::statx(
            libc::AT_FDCWD,
            c.as_ptr(),
            0,
            libc::STATX_DIOALIGN,
            &mut stx,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    if stx.stx_mask & libc::STATX_DIOALIGN != 0 {
        if stx.stx_dio_offset_align == 0 {
            // The filesystem says O_DIRECT is not supported on this file.
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "O_DIRECT is not supported on this file",
            ));
        }
        Ok((stx.stx_dio_offset_align as usize)
            .max(stx.stx_dio_mem_align as usize)
            .max(512))
    } else {
        Ok(4096)
    }
}

fn check_aligned(align: usize, off: u64, len: usize, ptr: *const u8) -> io::Result<()> {
    if !off.is_multiple_of(align as u64)
        || !len.is_multiple_of(align)
        || !(ptr as usize).is_multiple_of(align)
    {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "unaligned O_DIRECT I/O",
        ));
    }
    Ok(())
}

impl Disk for FileDisk {
    fn capacity(&self) -> u64 {
        self.capacity
    }

    fn alignment(&self) -> usize {
        self.alignment
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        check_aligned(self.alignment, offset, buf.len(), buf.as_ptr())?;
        let mut done = 0usize;
        while done < buf.len() {
            let rest = &mut buf[done..];
            // SAFETY: rest is a valid writable region of rest.len() bytes.
            let n = unsafe {
                libc::pread(
                    self.fd(),
                    rest.as_mut_ptr().cast(),
                    rest.len(),
                    (offset + done as u64) as libc::off_t,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "read past the end of the device",
                ));
            }
            done += n as usize;
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        check_aligned(self.alignment, offset, buf.len(), buf.as_ptr())?;
        let mut done = 0usize;
        while done < buf.len() {
            let rest = &buf[done..];
            // SAFETY: rest is a valid readable region.
            let n = unsafe {
                libc::pwrite(
                    self.fd(),
                    rest.as_ptr().cast(),
                    rest.len(),
                    (offset + done as u64) as libc::off_t,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::WriteZero,
                    "device accepted no bytes",
                ));
            }
            done += n as usize;
        }
        Ok(())
    }

    /// Reads of one batch go to the kernel together through a ring owned by the calling
    /// thread (readers run on many threads and must not queue behind each other).
    fn read_batch(&self, reads: &mut [(u64, &mut [u8])]) -> Vec<io::Result<()>> {
        thread_local! {
            static READ_RING: std::cell::RefCell<Option<IoUring>> =
                std::cell::RefCell::new(IoUring::new(READ_RING_ENTRIES).ok());
        }
        if reads.len() < 2 || reads.len() > READ_RING_ENTRIES as usize {
            return read_each(self, reads);
        }
        READ_RING.with(|cell| {
            let mut slot = cell.borrow_mut();
            let Some(ring) = slot.as_mut() else {
                return read_each(self, reads);
            };
            let mut results: Vec<io::Result<()>> = reads
                .iter()
                .map(|(off, buf)| check_aligned(self.alignment, *off, buf.len(), buf.as_ptr()))
                .collect();
            let mut submitted = 0;
            for (i, (off, buf)) in reads.iter_mut().enumerate() {
                if results[i].is_err() {
                    continue;
                }
                let sqe =
                    opcode::Read::new(types::Fd(self.fd()), buf.as_mut_ptr(), buf.len() as u32)
                        .offset(*off)
                        .build()
                        .user_data(i as u64);
                // SAFETY: the buffers outlive the wait below; the ring has room for them all.
                unsafe {
                    ring.submission()
                        .push(&sqe)
                        .expect("read ring sized for the batch")
                };
                submitted += 1;
            }
            let mut reaped = 0;
            let mut done = vec![false; reads.len()];
            while reaped < submitted {
                if let Err(e) = ring.submit_and_wait(submitted - reaped) {
                    if e.kind() == io::ErrorKind::Interrupted {
                        continue;
                    }
                    // The ring is unusable. Reads not reaped fail; the kernel may still
                    // complete them into their buffers, so a caller that sees an error must
                    // not reuse its buffers (the read path leaks its buffer then).
                    for (i, r) in results.iter_mut().enumerate() {
                        if r.is_ok() && !done[i] {
                            *r = Err(io::Error::new(e.kind(), e.to_string()));
                        }
                    }
                    *slot = None;
                    return results;
                }
                for cqe in ring.completion() {
                    let i = cqe.user_data() as usize;
                    let res = cqe.result();
                    done[i] = true;
                    let (off, buf) = &mut reads[i];
                    results[i] = if res < 0 {
                        Err(io::Error::from_raw_os_error(-res))
                    } else if (res as usize) < buf.len() {
                        let n = res as usize;
                        self.read_at(&mut buf[n..], *off + n as u64)
                    } else {
                        Ok(())
                    };
                    reaped += 1;
                }
            }
            results
        })
    }

    fn write_batch(&self, writes: &[(u64, &[u8])]) -> Vec<io::Result<()>> {
        if let [(off, buf)] = writes {
            // One write: a pwrite is cheaper than a trip through the ring.
            return vec![self.write_at(buf, *off)];
        }
        let mut results = Vec::with_capacity(writes.len());
        for part in writes.chunks(MAX_TICKET_WRITES) {
            // SAFETY: the buffers are borrowed until this function returns, after the finish.
            let ticket = unsafe { self.start_writes(part) };
            results.extend(self.finish_writes(ticket));
        }
        results
    }

    unsafe fn start_writes(&self, writes: &[(u64, &[u8])]) -> WriteTicket {
        let Some(ring) = &self.ring else {
            return WriteTicket::Done(write_each(self, writes));
        };
        // A ticket holds at most MAX_TICKET_WRITES submissions; writes to adjacent ranges
        // share one (below).
        let submissions = 1 + writes
            .windows(2)
            .filter(|w| w[1].0 != w[0].0 + w[0].1.len() as u64)
            .count();
        if submissions > MAX_TICKET_WRITES || writes.len() >= 1 << TICKET_SHIFT {
            return WriteTicket::Done(self.write_batch(writes));
        }
        let mut r = ring.lock();
        if r.broken {
            return WriteTicket::Done(write_each(self, writes));
        }
        let id = r.next_ticket;
        r.next_ticket += 1;
        let mut entries: Vec<InFlightWrite> = writes
            .iter()
            .map(|&(off, buf)| InFlightWrite {
                sync: false,
                off,
                ptr: buf.as_ptr() as usize,
                len: buf.len(),
                result: check_aligned(self.alignment, off, buf.len(), buf.as_ptr())
                    .err()
                    .map(Err),
                run: 0,
                iovecs: Vec::new(),
            })
            .collect();
        // Writes to adjacent device ranges (a large append's units, headers and data) go
        // to the kernel as one vectored write: one device I/O instead of several.
        let mut i = 0;
        while i < entries.len() {
            if entries[i].result.is_some() {
                i += 1;
                continue;
            }
            let mut j = i + 1;
            while j < entries.len()
                && j - i < MAX_IOVECS
                && entries[j].result.is_none()
                && entries[j].off == entries[j - 1].off + entries[j - 1].len as u64
            {
                j += 1;
            }
            let iovecs: Vec<libc::iovec> = entries[i..j]
                .iter()
                .map(|e| libc::iovec {
                    iov_base: e.ptr as *mut libc::c_void,
                    iov_len: e.len,
                })
                .collect();
            let ud = (id << TICKET_SHIFT) | i as u64;
            let sqe = if j - i == 1 {
                opcode::Write::new(
                    types::Fd(self.fd()),
                    entries[i].ptr as *const u8,
                    entries[i].len as u32,
                )
                .offset(entries[i].off)
                .build()
                .user_data(ud)
            } else {
                opcode::Writev::new(types::Fd(self.fd()), iovecs.as_ptr(), iovecs.len() as u32)
                    .offset(entries[i].off)
                    .build()
                    .user_data(ud)
            };
            // SAFETY: the caller keeps the buffers valid until the ticket is finished, and
            // the iovecs live in the ticket's entry until then; the queue has room (every
            // start and wait submits, so at most a doorbell poll is queued before a ticket's
            // MAX_TICKET_WRITES).
            unsafe {
                r.ring
                    .submission()
                    .push(&sqe)
                    .expect("submission queue has room for a ticket")
            };
            entries[i].run = j - i;
            entries[i].iovecs = iovecs;
            i = j;
        }
        r.tickets.insert(id, entries);
        self.submit(&mut r);
        WriteTicket::Pending(id)
    }

    fn start_sync(&self) -> WriteTicket {
        let Some(ring) = &self.ring else {
            return WriteTicket::Done(vec![self.sync()]);
        };
        let mut r = ring.lock();
        if r.broken {
            return WriteTicket::Done(vec![self.sync()]);
        }
        let id = r.next_ticket;
        r.next_ticket += 1;
        let sqe = opcode::Fsync::new(types::Fd(self.fd()))
            .flags(types::FsyncFlags::DATASYNC)
            .build()
            .user_data(id << TICKET_SHIFT);
        // SAFETY: a flush borrows no memory; every start and wait submits, so the queue has
        // room.
        unsafe {
            r.ring
                .submission()
                .push(&sqe)
                .expect("submission queue has room for a flush")
        };
        r.tickets.insert(
            id,
            vec![InFlightWrite {
                sync: true,
                off: 0,
                ptr: 0,
                len: 0,
                result: None,
                run: 0,
                iovecs: Vec::new(),
            }],
        );
        self.submit(&mut r);
        WriteTicket::Pending(id)
    }

    fn wait_writes(&self, tickets: &[&WriteTicket], wait: Wait) -> Option<usize> {
        let ids: Vec<Option<u64>> = tickets
            .iter()
            .map(|t| match t {
                WriteTicket::Done(_) => None,
                WriteTicket::Pending(id) => Some(*id),
            })
            .collect();
        if let Some(i) = ids.iter().position(Option::is_none) {
            return Some(i);
        }
        let ring = self.ring.as_ref()?;
        let mut r = ring.lock();
        loop {
            if r.broken {
                self.finish_synchronously(&mut r);
            } else {
                self.reap(&mut r);
            }
            let done = ids.iter().position(|id| {
                let id = id.expect("pending");
                r.tickets[&id].iter().all(|e| e.result.is_some())
            });
            if done.is_some() {
                return done;
            }
            match wait {
                Wait::Poll => return None,
                Wait::Block => {}
                Wait::Doorbell(fd) => {
                    if std::mem::take(&mut r.doorbell_rang) {
                        return None;
                    }
                    if !r.doorbell_armed {
                        let sqe = opcode::PollAdd::new(types::Fd(fd), libc::POLLIN as u32)
                            .build()
                            .user_data(DOORBELL);
                        // SAFETY: a poll borrows no memory; every start submits, so the queue
                        // has room.
                        unsafe {
                            r.ring
                                .submission()
                                .push(&sqe)
                                .expect("submission queue has room for the doorbell")
                        };
                        r.doorbell_armed = true;
                    }
                }
            }
            if let Err(e) = r.ring.submit_and_wait(1)
                && e.kind() != io::ErrorKind::Interrupted
            {
                self.finish_synchronously(&mut r);
            }
        }
    }

    fn finish_writes(&self, ticket: WriteTicket) -> Vec<io::Result<()>> {
        let id = match ticket {
            WriteTicket::Done(r) => return r,
            WriteTicket::Pending(id) => id,
        };
        let ring = self
            .ring
            .as_ref()
            .expect("pending tickets come from the ring");
        let mut r = ring.lock();
        loop {
            let done = r.tickets[&id].iter().all(|e| e.result.is_some());
            if done {
                let entries = r.tickets.remove(&id).expect("ticket");
                return entries
                    .into_iter()
                    .map(|e| e.result.expect("finished"))
                    .collect();
            }
            if r.broken {
                self.finish_synchronously(&mut r);
                continue;
            }
            if let Err(e) = r.ring.submit_and_wait(1) {
                if e.kind() != io::ErrorKind::Interrupted {
                    self.finish_synchronously(&mut r);
                }
                continue;
            }
            self.reap(&mut r);
        }
    }

    fn sync(&self) -> io::Result<()> {
        // SAFETY: plain syscall on an fd we own.
        let rc = unsafe { libc::fdatasync(self.fd()) };
        if rc != 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    }
}

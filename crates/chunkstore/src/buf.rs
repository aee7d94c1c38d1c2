//! Aligned byte buffers for O_DIRECT I/O.
//!
//! O_DIRECT needs the buffer address, the file offset and the length to be multiples of the
//! device's alignment. Every buffer here is aligned to [`BUF_ALIGN`] (a page), which satisfies
//! every device alignment up to 4 KiB; lengths are the caller's business.

use parking_lot::Mutex;
use std::alloc::{Layout, alloc, dealloc};
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// Memory alignment of every [`AlignedBuf`]. Devices report ≤ 4096 (`stx_dio_mem_align`).
pub const BUF_ALIGN: usize = 4096;

/// A zero-initialised, page-aligned, fixed-length heap buffer.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like a Box<[u8]>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only hands out &[u8].
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes (`len` may be 0).
    ///
    /// # Panics
    /// If the allocation fails or `len` overflows a `Layout`.
    pub fn zeroed(len: usize) -> Self {
        if len == 0 {
            return Self {
                ptr: NonNull::<u8>::dangling(),
                len: 0,
            };
        }
        let layout = layout_for(len);
        // SAFETY: layout has non-zero size.
        let raw = unsafe { alloc(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        if layout.align() == HUGE_PAGE {
            // Ask for transparent huge pages before the first touch: a buffer in a few
            // physically contiguous pages is a few DMA segments instead of hundreds, and
            // O_DIRECT pins one page instead of 512. Advice only; failure changes nothing.
            // SAFETY: the range is this allocation.
            unsafe {
                libc::madvise(raw.cast(), layout.size(), libc::MADV_HUGEPAGE);
            }
        }
        // SAFETY: `raw` is valid for `layout.size()` bytes.
        unsafe { std::ptr::write_bytes(raw, 0, layout.size()) };
        Self { ptr, len }
    }

    /// An aligned copy of `bytes`.
    pub fn copy_of(bytes: &[u8]) -> Self {
        let mut b = Self::zeroed(bytes.len());
        b.copy_from_slice(bytes);
        b
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Buffers of at least this many bytes are placed in transparent huge pages.
const HUGE_FROM: usize = 1 << 20;
const HUGE_PAGE: usize = 2 << 20;

fn layout_for(len: usize) -> Layout {
    if len >= HUGE_FROM {
        Layout::from_size_align(len.next_multiple_of(HUGE_PAGE), HUGE_PAGE).expect("buffer layout")
    } else {
        Layout::from_size_align(len, BUF_ALIGN).expect("buffer layout")
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if self.len != 0 {
            let layout = layout_for(self.len);
            // SAFETY: allocated in `zeroed` with this exact layout.
            unsafe { dealloc(self.ptr.as_ptr(), layout) };
        }
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is valid for len initialised bytes (or dangling with len 0).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and we hold &mut self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Clone for AlignedBuf {
    fn clone(&self) -> Self {
        Self::copy_of(self)
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBuf({} bytes)", self.len)
    }
}

/// Aligned buffers kept for reuse, because fresh zeroed memory costs a page fault per page on
/// first touch and a pass of zeroing: the store's write and read buffers, and a chunkserver's
/// receive buffers for large payloads.
pub struct BufPool {
    bufs: Mutex<Vec<AlignedBuf>>,
    /// Buffers kept, at most.
    max: usize,
}

impl Default for BufPool {
    fn default() -> Self {
        Self::new(64)
    }
}

impl BufPool {
    /// A pool keeping at most `max` buffers.
    pub fn new(max: usize) -> Self {
        Self {
            bufs: Mutex::default(),
            max,
        }
    }

    /// A buffer of at least `len` bytes (contents arbitrary): a pooled one that fits, or a
    /// new one.
    pub fn take(&self, len: usize) -> AlignedBuf {
        let mut bufs = self.bufs.lock();
        // Of the smallest that fit, the most recently returned: it is likeliest in cache.
        let best = bufs
            .iter()
            .enumerate()
            .rev()
            .filter(|(_, b)| b.len() >= len)
            .min_by_key(|(_, b)| b.len())
            .map(|(i, _)| i);
        match best {
            Some(i) => bufs.remove(i),
            None => {
                drop(bufs);
                AlignedBuf::zeroed(len.next_power_of_two())
            }
        }
    }

    /// Returns a buffer for reuse; when the pool is full the smallest buffer goes.
    pub fn give(&self, buf: AlignedBuf) {
        if buf.is_empty() {
            return;
        }
        let mut bufs = self.bufs.lock();
        if bufs.len() < self.max {
            bufs.push(buf);
            return;
        }
        if let Some((i, small)) = bufs.iter().enumerate().min_by_key(|(_, b)| b.len())
            && small.len() < buf.len()
        {
            bufs[i] = buf;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_and_zeroed() {
        for len in [0, 1, 512, 4096, 1 << 20] {
            let b = AlignedBuf::zeroed(len);
            assert_eq!(b.len(), len);
            if len > 0 {
                assert_eq!(b.as_ptr() as usize % BUF_ALIGN, 0);
                assert!(b.iter().all(|&x| x == 0));
            }
        }
    }
}

//! The SDK without async, for scripts and tools: each call runs on the client's own runtime.

use crate::fs::{self, CreateOptions, DirEntry, FileStat, Result};
use std::sync::Arc;

/// A blocking [`fs::Client`].
pub struct Client {
    rt: Arc<tokio::runtime::Runtime>,
    inner: fs::Client,
}

/// A blocking [`fs::FlatLogFile`].
pub struct FlatLogFile {
    rt: Arc<tokio::runtime::Runtime>,
    inner: Option<fs::FlatLogFile>,
}

impl Client {
    /// # Errors
    /// As [`fs::Client::connect`], or the runtime cannot start.
    pub fn connect(masters: &[String]) -> Result<Self> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| fs::Error::Writer(format!("runtime: {e}")))?;
        let inner = rt.block_on(fs::Client::connect(masters))?;
        Ok(Self {
            rt: Arc::new(rt),
            inner,
        })
    }

    pub fn create(&self, path: &str, opts: CreateOptions) -> Result<FlatLogFile> {
        let f = self.rt.block_on(self.inner.create(path, opts))?;
        Ok(FlatLogFile {
            rt: self.rt.clone(),
            inner: Some(f),
        })
    }

    pub fn open_append(&self, path: &str) -> Result<FlatLogFile> {
        let f = self.rt.block_on(self.inner.open_append(path))?;
        Ok(FlatLogFile {
            rt: self.rt.clone(),
            inner: Some(f),
        })
    }

    pub fn read(&self, path: &str, offset: u64, len: usize) -> Result<Vec<u8>> {
        self.rt.block_on(self.inner.read(path, offset, len))
    }

    pub fn stat(&self, path: &str) -> Result<FileStat> {
        self.rt.block_on(self.inner.stat(path))
    }

    pub fn list(&self, path: &str) -> Result<Vec<DirEntry>> {
        self.rt.block_on(self.inner.list(path))
    }

    pub fn mkdir(&self, path: &str, parents: bool) -> Result<()> {
        self.rt.block_on(self.inner.mkdir(path, parents))
    }

    pub fn rename(&self, from: &str, to: &str) -> Result<()> {
        self.rt.block_on(self.inner.rename(from, to))
    }

    pub fn delete(&self, path: &str) -> Result<()> {
        self.rt.block_on(self.inner.delete(path))
    }
}

impl FlatLogFile {
    fn file(&mut self) -> &mut fs::FlatLogFile {
        self.inner.as_mut().expect("present until close")
    }

    pub fn append(&mut self, data: &[u8]) -> Result<u64> {
        let rt = self.rt.clone();
        rt.block_on(self.file().append(data))
    }

    /// [`fs::FlatLogFile::append_bytes`]: appends without copying `data`.
    pub fn append_bytes(&mut self, data: bytes::Bytes) -> Result<u64> {
        let rt = self.rt.clone();
        rt.block_on(self.file().append_bytes(data))
    }

    pub fn len(&self) -> u64 {
        self.inner.as_ref().map_or(0, fs::FlatLogFile::len)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn close(mut self) -> Result<u64> {
        let f = self.inner.take().expect("present");
        self.rt.block_on(f.close())
    }

    pub fn seal(mut self) -> Result<u64> {
        let f = self.inner.take().expect("present");
        self.rt.block_on(f.seal())
    }
}

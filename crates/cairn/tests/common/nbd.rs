//! A raw NBD client (fixed newstyle, simple replies) for the tests: bad input, fencing, and
//! the models of the block tests and the nemesis.

// NBD is big-endian on the wire.
#![allow(clippy::big_endian_bytes)]

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use super::Proc;

/// A `cairn nbd` process serving the cluster of `masters` in plain NBD on loopback
/// (`--nbd-insecure`; leases renewed every second), started.
pub fn server(masters: &[String], extra: &[&str]) -> Proc {
    let mut args = vec!["--nbd-insecure"];
    args.extend_from_slice(extra);
    server_with(masters, &args)
}

/// A `cairn nbd` process with only `extra` besides its listen address, masters and lease
/// renewal (TLS unless `extra` says `--nbd-insecure`), started.
pub fn server_with(masters: &[String], extra: &[&str]) -> Proc {
    let mut p = Proc {
        name: "nbd".into(),
        args: [
            "nbd",
            "--listen",
            "127.0.0.1:0",
            "--masters",
            &masters.join(","),
        ]
        .iter()
        .chain(["--renew-ms", "1000"].iter())
        .chain(extra)
        .map(|s| s.to_string())
        .collect(),
        addr: String::new(),
        child: None,
    };
    p.start();
    p
}

pub struct Raw {
    pub s: TcpStream,
}

pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;

impl Raw {
    pub fn connect(addr: &str) -> Self {
        Self::try_connect(addr).unwrap()
    }

    /// Connects and reads the server's greeting.
    pub fn try_connect(addr: &str) -> io::Result<Self> {
        let mut s = TcpStream::connect(addr)?;
        s.set_read_timeout(Some(Duration::from_secs(30)))?;
        let mut hello = [0u8; 18];
        s.read_exact(&mut hello)?;
        assert_eq!(&hello[..8], b"NBDMAGIC");
        assert_eq!(
            u64::from_be_bytes(hello[8..16].try_into().unwrap()),
            IHAVEOPT
        );
        Ok(Self { s })
    }

    /// Connects and opens export `name` (fixed newstyle, no zeroes, NBD_OPT_GO).
    pub fn open(addr: &str, name: &str) -> io::Result<Self> {
        let mut c = Self::try_connect(addr)?;
        c.s.write_all(&3u32.to_be_bytes())?;
        match c.try_go(name)? {
            1 => Ok(c),
            kind => Err(io::Error::other(format!(
                "NBD_OPT_GO {name}: reply {kind:#x}"
            ))),
        }
    }

    pub fn flags(&mut self, f: u32) {
        self.s.write_all(&f.to_be_bytes()).unwrap();
    }

    pub fn option(&mut self, opt: u32, data: &[u8]) {
        self.try_option(opt, data).unwrap();
    }

    fn try_option(&mut self, opt: u32, data: &[u8]) -> io::Result<()> {
        let mut b = IHAVEOPT.to_be_bytes().to_vec();
        b.extend_from_slice(&opt.to_be_bytes());
        b.extend_from_slice(&(data.len() as u32).to_be_bytes());
        b.extend_from_slice(data);
        self.s.write_all(&b)
    }

    /// (option, reply type, payload).
    pub fn option_reply(&mut self) -> (u32, u32, Vec<u8>) {
        self.try_option_reply().unwrap()
    }

    fn try_option_reply(&mut self) -> io::Result<(u32, u32, Vec<u8>)> {
        let mut h = [0u8; 20];
        self.s.read_exact(&mut h)?;
        assert_eq!(
            u64::from_be_bytes(h[..8].try_into().unwrap()),
            0x0003_e889_0455_65a9
        );
        let len = u32::from_be_bytes(h[16..20].try_into().unwrap()) as usize;
        let mut p = vec![0u8; len];
        self.s.read_exact(&mut p)?;
        Ok((
            u32::from_be_bytes(h[8..12].try_into().unwrap()),
            u32::from_be_bytes(h[12..16].try_into().unwrap()),
            p,
        ))
    }

    /// NBD_OPT_GO for `name`; the final reply type.
    pub fn go(&mut self, name: &str) -> u32 {
        self.try_go(name).unwrap()
    }

    fn try_go(&mut self, name: &str) -> io::Result<u32> {
        let mut d = (name.len() as u32).to_be_bytes().to_vec();
        d.extend_from_slice(name.as_bytes());
        d.extend_from_slice(&0u16.to_be_bytes());
        self.try_option(7, &d)?;
        loop {
            let (_, kind, _) = self.try_option_reply()?;
            if kind != 3 {
                return Ok(kind);
            }
        }
    }

    pub fn request(
        &mut self,
        kind: u16,
        flags: u16,
        cookie: u64,
        offset: u64,
        len: u32,
        data: &[u8],
    ) {
        self.try_request(kind, flags, cookie, offset, len, data)
            .unwrap();
    }

    pub fn try_request(
        &mut self,
        kind: u16,
        flags: u16,
        cookie: u64,
        offset: u64,
        len: u32,
        data: &[u8],
    ) -> io::Result<()> {
        let mut b = 0x2560_9513u32.to_be_bytes().to_vec();
        b.extend_from_slice(&flags.to_be_bytes());
        b.extend_from_slice(&kind.to_be_bytes());
        b.extend_from_slice(&cookie.to_be_bytes());
        b.extend_from_slice(&offset.to_be_bytes());
        b.extend_from_slice(&len.to_be_bytes());
        b.extend_from_slice(data);
        self.s.write_all(&b)
    }

    /// A simple reply: (error, cookie); `read` bytes of data follow a successful read.
    pub fn reply(&mut self, read: usize) -> (u32, u64, Vec<u8>) {
        self.try_reply(read).unwrap()
    }

    pub fn try_reply(&mut self, read: usize) -> io::Result<(u32, u64, Vec<u8>)> {
        let mut h = [0u8; 16];
        self.s.read_exact(&mut h)?;
        assert_eq!(u32::from_be_bytes(h[..4].try_into().unwrap()), 0x6744_6698);
        let err = u32::from_be_bytes(h[4..8].try_into().unwrap());
        let cookie = u64::from_be_bytes(h[8..16].try_into().unwrap());
        let mut d = vec![0u8; if err == 0 { read } else { 0 }];
        self.s.read_exact(&mut d)?;
        Ok((err, cookie, d))
    }

    /// One request and its reply: the NBD error (0: none) and a read's data.
    pub fn call(
        &mut self,
        kind: u16,
        flags: u16,
        offset: u64,
        len: u32,
        data: &[u8],
    ) -> io::Result<(u32, Vec<u8>)> {
        self.try_request(kind, flags, 1, offset, len, data)?;
        let read = if kind == READ { len as usize } else { 0 };
        let (err, _, d) = self.try_reply(read)?;
        Ok((err, d))
    }

    /// The server closed the connection (EOF or reset) within the read timeout.
    pub fn closed(&mut self) -> bool {
        let mut b = [0u8; 64];
        loop {
            match self.s.read(&mut b) {
                Ok(0) | Err(_) => return true,
                Ok(_) => {}
            }
        }
    }
}

pub const READ: u16 = 0;
pub const WRITE: u16 = 1;
pub const FLUSH: u16 = 3;
pub const TRIM: u16 = 4;
pub const FUA: u16 = 1;

/// Deterministic bytes.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| ((i.wrapping_mul(0x9e37_79b9) ^ seed.wrapping_mul(0x85eb_ca6b)) >> 7) as u8)
        .collect()
}

/// Block `v` of the models (4 KiB): its id, then bytes of its own; 0 is a block of zeros.
pub fn block_of(v: u64) -> Vec<u8> {
    if v == 0 {
        return vec![0u8; 4096];
    }
    let mut b = v.to_le_bytes().to_vec();
    b.extend(pattern(v, 4096 - 8));
    b
}

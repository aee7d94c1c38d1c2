//! The NBD protocol's fixed-newstyle handshake and transmission messages (the NBD protocol
//! document, "proto.md" of the NBD project): constants, and parsers of what a client sends
//! (fuzzed: fuzz/fuzz_targets/nbd_request.rs). All integers are big-endian on the wire.

// NBD is big-endian on the wire (Cairn's own formats are little-endian).
#![allow(clippy::big_endian_bytes)]

/// "NBDMAGIC".
pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
/// "IHAVEOPT": the newstyle magic, and the start of every option a client sends.
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// Starts every option reply.
pub const REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

// Handshake flags (server) and client flags.
pub const FLAG_FIXED_NEWSTYLE: u16 = 1;
pub const FLAG_NO_ZEROES: u16 = 2;

// Options.
pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_STARTTLS: u32 = 5;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;
pub const OPT_STRUCTURED_REPLY: u32 = 8;

// Option reply types.
pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
pub const REP_ERR_UNSUP: u32 = (1 << 31) + 1;
pub const REP_ERR_POLICY: u32 = (1 << 31) + 2;
pub const REP_ERR_INVALID: u32 = (1 << 31) + 3;
pub const REP_ERR_TLS_REQD: u32 = (1 << 31) + 5;
pub const REP_ERR_UNKNOWN: u32 = (1 << 31) + 6;
pub const REP_ERR_TOO_BIG: u32 = (1 << 31) + 9;

// Info types.
pub const INFO_EXPORT: u16 = 0;
pub const INFO_NAME: u16 = 1;
pub const INFO_DESCRIPTION: u16 = 2;
pub const INFO_BLOCK_SIZE: u16 = 3;

// Transmission flags.
pub const TFLAG_HAS_FLAGS: u16 = 1;
pub const TFLAG_READ_ONLY: u16 = 1 << 1;
pub const TFLAG_SEND_FLUSH: u16 = 1 << 2;
pub const TFLAG_SEND_FUA: u16 = 1 << 3;
pub const TFLAG_SEND_TRIM: u16 = 1 << 5;
pub const TFLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const TFLAG_CAN_MULTI_CONN: u16 = 1 << 8;

// Commands and their flags.
pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_WRITE_ZEROES: u16 = 6;
pub const CMD_FLAG_FUA: u16 = 1;
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;
pub const CMD_FLAG_DF: u16 = 1 << 2;

// Structured reply types and flags.
pub const REPLY_FLAG_DONE: u16 = 1;
pub const REPLY_TYPE_NONE: u16 = 0;
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
pub const REPLY_TYPE_ERROR: u16 = (1 << 15) + 1;

// Errors (errno values the protocol names).
pub const EPERM: u32 = 1;
pub const EIO: u32 = 5;
pub const ENOMEM: u32 = 12;
pub const EINVAL: u32 = 22;
pub const ENOSPC: u32 = 28;
pub const EOVERFLOW: u32 = 75;
pub const ENOTSUP: u32 = 95;
pub const ESHUTDOWN: u32 = 108;

/// Bytes of a transmission request's header.
pub const REQUEST_BYTES: usize = 28;
/// The longest export name or option payload accepted.
pub const MAX_OPTION: usize = 4096;

/// Why bytes from a client are not a message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtoError {
    #[error("bad magic {0:#x}")]
    Magic(u64),
    #[error("{0}")]
    Invalid(&'static str),
}

/// A transmission request's header (its WRITE payload follows it on the wire).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub flags: u16,
    pub kind: u16,
    pub cookie: u64,
    pub offset: u64,
    pub length: u32,
}

impl Request {
    /// # Errors
    /// The magic is wrong (the stream is lost: the server closes it).
    pub fn decode(b: &[u8; REQUEST_BYTES]) -> Result<Self, ProtoError> {
        let magic = u32::from_be_bytes(b[0..4].try_into().expect("4"));
        if magic != REQUEST_MAGIC {
            return Err(ProtoError::Magic(u64::from(magic)));
        }
        Ok(Self {
            flags: u16::from_be_bytes(b[4..6].try_into().expect("2")),
            kind: u16::from_be_bytes(b[6..8].try_into().expect("2")),
            cookie: u64::from_be_bytes(b[8..16].try_into().expect("8")),
            offset: u64::from_be_bytes(b[16..24].try_into().expect("8")),
            length: u32::from_be_bytes(b[24..28].try_into().expect("4")),
        })
    }

    pub fn encode(&self) -> [u8; REQUEST_BYTES] {
        let mut b = [0u8; REQUEST_BYTES];
        b[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        b[4..6].copy_from_slice(&self.flags.to_be_bytes());
        b[6..8].copy_from_slice(&self.kind.to_be_bytes());
        b[8..16].copy_from_slice(&self.cookie.to_be_bytes());
        b[16..24].copy_from_slice(&self.offset.to_be_bytes());
        b[24..28].copy_from_slice(&self.length.to_be_bytes());
        b
    }
}

/// An option's header: (option, payload length).
///
/// # Errors
/// The magic is not IHAVEOPT.
pub fn option_header(b: &[u8; 16]) -> Result<(u32, u32), ProtoError> {
    let magic = u64::from_be_bytes(b[0..8].try_into().expect("8"));
    if magic != IHAVEOPT {
        return Err(ProtoError::Magic(magic));
    }
    Ok((
        u32::from_be_bytes(b[8..12].try_into().expect("4")),
        u32::from_be_bytes(b[12..16].try_into().expect("4")),
    ))
}

/// The payload of NBD_OPT_INFO and NBD_OPT_GO: the export name and the info types asked for.
///
/// # Errors
/// Lengths that do not add up to the payload.
pub fn info_request(b: &[u8]) -> Result<(String, Vec<u16>), ProtoError> {
    let short = ProtoError::Invalid("option payload shorter than its lengths");
    let n = u32::from_be_bytes(b.get(0..4).ok_or(short.clone())?.try_into().expect("4")) as usize;
    let name = b.get(4..4 + n).ok_or(short.clone())?;
    let at = 4 + n;
    let count = u16::from_be_bytes(
        b.get(at..at + 2)
            .ok_or(short.clone())?
            .try_into()
            .expect("2"),
    ) as usize;
    let rest = &b[at + 2..];
    if rest.len() != count * 2 {
        return Err(ProtoError::Invalid(
            "info request count and length disagree",
        ));
    }
    let infos = rest
        .chunks_exact(2)
        .map(|c| u16::from_be_bytes(c.try_into().expect("2")))
        .collect();
    let name = String::from_utf8(name.to_vec())
        .map_err(|_| ProtoError::Invalid("export name is not UTF-8"))?;
    Ok((name, infos))
}

/// An option reply: magic, option, type, payload.
pub fn option_reply(option: u32, kind: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(20 + payload.len());
    out.extend_from_slice(&REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&kind.to_be_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// A simple reply's header (a successful READ's data follows it).
pub fn simple_reply(error: u32, cookie: u64) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    b[4..8].copy_from_slice(&error.to_be_bytes());
    b[8..16].copy_from_slice(&cookie.to_be_bytes());
    b
}

/// A structured reply chunk's header; `length` bytes of payload follow.
pub fn structured_header(flags: u16, kind: u16, cookie: u64, length: u32) -> [u8; 20] {
    let mut b = [0u8; 20];
    b[0..4].copy_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    b[4..6].copy_from_slice(&flags.to_be_bytes());
    b[6..8].copy_from_slice(&kind.to_be_bytes());
    b[8..16].copy_from_slice(&cookie.to_be_bytes());
    b[16..20].copy_from_slice(&length.to_be_bytes());
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip() {
        let r = Request {
            flags: CMD_FLAG_FUA,
            kind: CMD_WRITE,
            cookie: 0xdead_beef,
            offset: 4096,
            length: 512,
        };
        assert_eq!(Request::decode(&r.encode()), Ok(r));
        let mut b = r.encode();
        b[0] ^= 1;
        assert!(Request::decode(&b).is_err());
    }

    #[test]
    fn info_requests_parse() {
        let mut b = Vec::new();
        b.extend_from_slice(&3u32.to_be_bytes());
        b.extend_from_slice(b"vol");
        b.extend_from_slice(&1u16.to_be_bytes());
        b.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
        assert_eq!(info_request(&b), Ok(("vol".into(), vec![INFO_BLOCK_SIZE])));
        assert!(info_request(&b[..b.len() - 1]).is_err());
        let mut long = b.clone();
        long[3] = 200;
        assert!(info_request(&long).is_err());
    }
}

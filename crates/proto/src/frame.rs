//! Data-plane frames: a fixed 64-byte header, then the raw payload (docs/formats/wire.md).

use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// CRC32C (Castagnoli), the checksum of headers and payloads: what
/// [`Header::with_payload`] puts in `payload_crc`, for a sender that sends the same payload in
/// several frames and computes it once ([`Header::with_payload_crc`]).
pub fn crc32c(bytes: &[u8]) -> u32 {
    crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, bytes) as u32
}

/// Bytes of every frame header.
pub const HEADER_BYTES: usize = 64;
/// "CRNF".
pub const MAGIC: [u8; 4] = *b"CRNF";
/// The only version this code speaks.
pub const VERSION: u8 = 1;
/// Largest payload a frame may carry: a whole 64 MiB chunk, with room for a create's first
/// append of the same size.
pub const MAX_PAYLOAD: u32 = 64 << 20;

/// `flags` bit: this frame is a reply.
pub const FLAG_REPLY: u16 = 1;
/// `flags` bit in stat/seal replies: the chunk is sealed.
pub const FLAG_SEALED: u16 = 2;
/// `flags` bit in seal requests: seal at `offset`, which may be below the chunk's length (the
/// bytes past it are dropped).
pub const FLAG_SEAL_AT: u16 = 4;
/// `flags` bit in append requests: answer before the bytes are durable (a conversion's group
/// members and other background writes, whose seal flushes them before they count).
pub const FLAG_UNSYNCED: u16 = 8;
const KNOWN_FLAGS: u16 = FLAG_REPLY | FLAG_SEALED | FLAG_SEAL_AT | FLAG_UNSYNCED;

/// The header as laid out on the wire.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy)]
#[repr(C)]
struct RawHeader {
    magic: [u8; 4],
    version: u8,
    opcode: u8,
    flags: U16,
    request_id: U64,
    chunk_id: U64,
    offset: U64,
    arg: U64,
    length: U32,
    payload_crc: U32,
    status: U16,
    cap_len: U16,
    reserved: U64,
    header_crc: U32,
}

const _: () = assert!(std::mem::size_of::<RawHeader>() == HEADER_BYTES);

/// Operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Opcode {
    Create = 1,
    Append = 2,
    Read = 3,
    Seal = 4,
    Delete = 5,
    Stat = 6,
    Ping = 7,
    /// Fault injection (servers started with `--fault-injection` only): the payload is a
    /// [`crate::fault::FaultSpec`]; an empty payload clears every fault.
    Fault = 8,
}

impl Opcode {
    /// Lower-case name (metrics labels, logs).
    pub fn name(self) -> &'static str {
        match self {
            Self::Create => "create",
            Self::Append => "append",
            Self::Read => "read",
            Self::Seal => "seal",
            Self::Delete => "delete",
            Self::Stat => "stat",
            Self::Ping => "ping",
            Self::Fault => "fault",
        }
    }

    /// Every opcode, at index `code - 1`.
    const ALL: [Self; 8] = [
        Self::Create,
        Self::Append,
        Self::Read,
        Self::Seal,
        Self::Delete,
        Self::Stat,
        Self::Ping,
        Self::Fault,
    ];

    pub fn from_u8(v: u8) -> Option<Self> {
        Self::ALL.get((v as usize).checked_sub(1)?).copied()
    }
}

/// Reply status codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum Status {
    Ok = 0,
    NotFound = 1,
    AlreadyExists = 2,
    WrongOffset = 3,
    Sealed = 4,
    OutOfRange = 5,
    TooLarge = 6,
    NoSpace = 7,
    Corrupt = 8,
    ChunkFailed = 9,
    StoreFailed = 10,
    BadRequest = 11,
    Io = 12,
    ShuttingDown = 13,
    /// The request's capability is missing, forged, expired, for another chunk or version,
    /// lacks a right, or belongs to a superseded writer (docs/security.md).
    Unauthorized = 14,
    /// The server cannot check capabilities yet (restarted, it has not had its keys from the
    /// masters' first heartbeat reply): retry shortly.
    NotReady = 15,
}

impl Status {
    /// Lower-case name (metrics labels, logs).
    pub fn name(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::NotFound => "not_found",
            Self::AlreadyExists => "already_exists",
            Self::WrongOffset => "wrong_offset",
            Self::Sealed => "sealed",
            Self::OutOfRange => "out_of_range",
            Self::TooLarge => "too_large",
            Self::NoSpace => "no_space",
            Self::Corrupt => "corrupt",
            Self::ChunkFailed => "chunk_failed",
            Self::StoreFailed => "store_failed",
            Self::BadRequest => "bad_request",
            Self::Io => "io",
            Self::ShuttingDown => "shutting_down",
            Self::Unauthorized => "unauthorized",
            Self::NotReady => "not_ready",
        }
    }

    /// Every status, at index `code`.
    const ALL: [Self; 16] = [
        Self::Ok,
        Self::NotFound,
        Self::AlreadyExists,
        Self::WrongOffset,
        Self::Sealed,
        Self::OutOfRange,
        Self::TooLarge,
        Self::NoSpace,
        Self::Corrupt,
        Self::ChunkFailed,
        Self::StoreFailed,
        Self::BadRequest,
        Self::Io,
        Self::ShuttingDown,
        Self::Unauthorized,
        Self::NotReady,
    ];

    pub fn from_u16(v: u16) -> Option<Self> {
        Self::ALL.get(v as usize).copied()
    }
}

/// A decoded header. `opcode` and `status` stay raw so that a well-formed frame with an
/// unknown opcode can still be answered (BAD_REQUEST) by request id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub opcode: u8,
    pub flags: u16,
    pub request_id: u64,
    pub chunk_id: u64,
    pub offset: u64,
    pub arg: u64,
    pub length: u32,
    pub payload_crc: u32,
    pub status: u16,
    /// Capability bytes between the header and the payload: 0, or
    /// [`crate::cap::CAP_BYTES`] in a request that carries one.
    pub cap_len: u16,
}

/// A frame that cannot be trusted: the connection must be closed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("bad magic {0:02x?}: not a Cairn data-plane frame")]
    BadMagic([u8; 4]),
    #[error("frame version {0}; this build speaks version {VERSION}")]
    BadVersion(u8),
    #[error("header CRC mismatch (stored {stored:#010x}, computed {computed:#010x})")]
    HeaderCrc { stored: u32, computed: u32 },
    #[error("unknown flags {0:#06x}")]
    Flags(u16),
    #[error("non-zero reserved bytes")]
    Reserved,
    #[error("capability of {0} bytes; a frame carries none or 80")]
    Capability(u16),
    #[error("payload of {0} bytes is larger than the maximum {MAX_PAYLOAD}")]
    TooLarge(u32),
    #[error("payload CRC mismatch (header {stored:#010x}, payload {computed:#010x})")]
    PayloadCrc { stored: u32, computed: u32 },
}

impl Header {
    /// A request header (payload length and CRC are set by [`Header::with_payload`]).
    pub fn request(opcode: Opcode, request_id: u64, chunk_id: u64) -> Self {
        Self {
            opcode: opcode as u8,
            flags: 0,
            request_id,
            chunk_id,
            offset: 0,
            arg: 0,
            length: 0,
            payload_crc: 0,
            status: 0,
            cap_len: 0,
        }
    }

    /// The reply header to this request, with `status` and no payload.
    pub fn reply(&self, status: Status) -> Self {
        Self {
            opcode: self.opcode,
            flags: FLAG_REPLY,
            request_id: self.request_id,
            chunk_id: self.chunk_id,
            offset: 0,
            arg: 0,
            length: 0,
            payload_crc: 0,
            status: status as u16,
            cap_len: 0,
        }
    }

    /// Sets `length` and `payload_crc` for `payload`.
    ///
    /// # Panics
    /// If the payload is larger than [`MAX_PAYLOAD`] (callers check sizes first).
    pub fn with_payload(mut self, payload: &[u8]) -> Self {
        assert!(payload.len() <= MAX_PAYLOAD as usize, "payload too large");
        self.length = payload.len() as u32;
        self.payload_crc = if payload.is_empty() {
            0
        } else {
            crc32c(payload)
        };
        self
    }

    /// Sets the payload's length and a CRC32C of it computed elsewhere (a chunk store read
    /// hands out the CRC its bytes were verified against).
    ///
    /// # Panics
    /// If the payload is larger than [`MAX_PAYLOAD`] (callers check sizes first).
    pub fn with_payload_crc(mut self, len: usize, crc: u32) -> Self {
        assert!(len <= MAX_PAYLOAD as usize, "payload too large");
        self.length = len as u32;
        self.payload_crc = if len == 0 { 0 } else { crc };
        self
    }

    pub fn op(&self) -> Option<Opcode> {
        Opcode::from_u8(self.opcode)
    }

    /// The status of a reply; `None` for a code this build does not know.
    pub fn status(&self) -> Option<Status> {
        Status::from_u16(self.status)
    }

    pub fn is_reply(&self) -> bool {
        self.flags & FLAG_REPLY != 0
    }

    pub fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut raw = RawHeader {
            magic: MAGIC,
            version: VERSION,
            opcode: self.opcode,
            flags: self.flags.into(),
            request_id: self.request_id.into(),
            chunk_id: self.chunk_id.into(),
            offset: self.offset.into(),
            arg: self.arg.into(),
            length: self.length.into(),
            payload_crc: self.payload_crc.into(),
            status: self.status.into(),
            cap_len: self.cap_len.into(),
            reserved: 0.into(),
            header_crc: 0.into(),
        };
        raw.header_crc = crc32c(&raw.as_bytes()[..HEADER_BYTES - 4]).into();
        let mut out = [0u8; HEADER_BYTES];
        out.copy_from_slice(raw.as_bytes());
        out
    }

    /// Decodes and checks a header. The payload is checked separately
    /// ([`Header::check_payload`]) once it has been read.
    pub fn decode(bytes: &[u8; HEADER_BYTES]) -> Result<Self, FrameError> {
        let raw = RawHeader::read_from_bytes(bytes).expect("64 bytes make a header");
        if raw.magic != MAGIC {
            return Err(FrameError::BadMagic(raw.magic));
        }
        if raw.version != VERSION {
            return Err(FrameError::BadVersion(raw.version));
        }
        let computed = crc32c(&bytes[..HEADER_BYTES - 4]);
        if raw.header_crc.get() != computed {
            return Err(FrameError::HeaderCrc {
                stored: raw.header_crc.get(),
                computed,
            });
        }
        if raw.flags.get() & !KNOWN_FLAGS != 0 {
            return Err(FrameError::Flags(raw.flags.get()));
        }
        if raw.reserved.get() != 0 {
            return Err(FrameError::Reserved);
        }
        let cap_len = raw.cap_len.get();
        if cap_len != 0
            && (usize::from(cap_len) != crate::cap::CAP_BYTES || raw.flags.get() & FLAG_REPLY != 0)
        {
            return Err(FrameError::Capability(raw.cap_len.get()));
        }
        if raw.length.get() > MAX_PAYLOAD {
            return Err(FrameError::TooLarge(raw.length.get()));
        }
        Ok(Self {
            opcode: raw.opcode,
            flags: raw.flags.get(),
            request_id: raw.request_id.get(),
            chunk_id: raw.chunk_id.get(),
            offset: raw.offset.get(),
            arg: raw.arg.get(),
            length: raw.length.get(),
            payload_crc: raw.payload_crc.get(),
            status: raw.status.get(),
            cap_len,
        })
    }

    /// Checks that `payload` is the one this header announces.
    pub fn check_payload(&self, payload: &[u8]) -> Result<(), FrameError> {
        let computed = if payload.is_empty() {
            0
        } else {
            crc32c(payload)
        };
        if payload.len() != self.length as usize || computed != self.payload_crc {
            return Err(FrameError::PayloadCrc {
                stored: self.payload_crc,
                computed,
            });
        }
        Ok(())
    }
}

/// The capability's size is fixed by the header's `cap_len` (docs/formats/wire.md).
const _: () = assert!(crate::cap::CAP_BYTES == 80);

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn header() -> impl Strategy<Value = Header> {
        (
            any::<u8>(),
            prop_oneof![
                Just(0u16),
                Just(FLAG_SEAL_AT),
                Just(FLAG_UNSYNCED),
                Just(FLAG_REPLY),
                Just(FLAG_REPLY | FLAG_SEALED)
            ],
            any::<u64>(),
            any::<u64>(),
            any::<u64>(),
            any::<u64>(),
            0..=MAX_PAYLOAD,
            any::<u32>(),
            any::<u16>(),
            prop_oneof![Just(0u16), Just(crate::cap::CAP_BYTES as u16)],
        )
            .prop_map(
                |(
                    opcode,
                    flags,
                    request_id,
                    chunk_id,
                    offset,
                    arg,
                    length,
                    payload_crc,
                    status,
                    cap_len,
                )| {
                    Header {
                        opcode,
                        flags,
                        request_id,
                        chunk_id,
                        offset,
                        arg,
                        length,
                        payload_crc,
                        status,
                        cap_len: if flags & FLAG_REPLY != 0 { 0 } else { cap_len },
                    }
                },
            )
    }

    proptest! {
        #[test]
        fn encode_decode_round_trips(h in header()) {
            prop_assert_eq!(Header::decode(&h.encode()).unwrap(), h);
        }

        #[test]
        fn any_flipped_bit_is_refused(h in header(), bit in 0usize..HEADER_BYTES * 8) {
            let mut b = h.encode();
            b[bit / 8] ^= 1 << (bit % 8);
            prop_assert!(Header::decode(&b).is_err());
        }
    }

    #[test]
    fn code_tables_match_the_discriminants() {
        for (i, op) in Opcode::ALL.iter().enumerate() {
            assert_eq!(*op as usize, i + 1);
            assert_eq!(Opcode::from_u8(*op as u8), Some(*op));
        }
        assert_eq!(Opcode::from_u8(0), None);
        assert_eq!(Opcode::from_u8(9), None);
        for (i, st) in Status::ALL.iter().enumerate() {
            assert_eq!(*st as usize, i);
            assert_eq!(Status::from_u16(*st as u16), Some(*st));
        }
        assert_eq!(Status::from_u16(16), None);
    }

    #[test]
    fn payload_crc_is_checked() {
        let h = Header::request(Opcode::Append, 1, 2).with_payload(b"hello");
        h.check_payload(b"hello").unwrap();
        assert!(matches!(
            h.check_payload(b"hellO"),
            Err(FrameError::PayloadCrc { .. })
        ));
        assert!(h.check_payload(b"hell").is_err());
    }

    #[test]
    fn layout_is_the_documented_one() {
        let mut h = Header::request(Opcode::Read, 0x0102, 0x0304);
        h.offset = 5;
        h.arg = 6;
        let b = h.encode();
        assert_eq!(&b[0..4], b"CRNF");
        assert_eq!(b[4], 1);
        assert_eq!(b[5], 3);
        assert_eq!(u64::from_le_bytes(b[8..16].try_into().unwrap()), 0x0102);
        assert_eq!(u64::from_le_bytes(b[16..24].try_into().unwrap()), 0x0304);
        assert_eq!(u64::from_le_bytes(b[24..32].try_into().unwrap()), 5);
        assert_eq!(u64::from_le_bytes(b[32..40].try_into().unwrap()), 6);
        assert_eq!(
            u32::from_le_bytes(b[60..64].try_into().unwrap()),
            crc32c(&b[..60])
        );
    }
}

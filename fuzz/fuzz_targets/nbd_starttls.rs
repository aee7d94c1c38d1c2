//! The NBD handshake of a server that requires TLS, up to the TLS handshake
//! (`cairn_block::nbd::starttls_handshake`): the greeting, the client's flags, then options —
//! every one but STARTTLS and ABORT refused with `ERR_TLS_REQD` (EXPORT_NAME closes). Bytes
//! from the network, before any credential. Never panics, never answers an option with
//! anything but an error or STARTTLS/ABORT's acknowledgement, and ends when the input ends.
#![no_main]
use cairn_block::nbd::proto::{OPT_ABORT, OPT_STARTTLS, REP_ACK};
use libfuzzer_sys::fuzz_target;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Option reply magic.
const REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;

fuzz_target!(|data: &[u8]| {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (mut client, mut server) = tokio::io::duplex(1 << 20);
        client.write_all(data).await.unwrap();
        client.shutdown().await.unwrap();
        let r = cairn_block::nbd::starttls_handshake(&mut server).await;
        drop(server);
        let mut out = Vec::new();
        client.read_to_end(&mut out).await.unwrap();
        // The greeting: magic, IHAVEOPT, handshake flags.
        assert!(out.len() >= 18 && out.starts_with(b"NBDMAGIC"), "no greeting");
        // Every reply is a well-formed option reply; an ACK only for STARTTLS or ABORT.
        let mut rest = &out[18..];
        let mut last_ack = None;
        while !rest.is_empty() {
            assert!(rest.len() >= 20, "a truncated reply");
            let magic = u64::from_be_bytes(rest[..8].try_into().unwrap());
            assert_eq!(magic, REPLY_MAGIC);
            let opt = u32::from_be_bytes(rest[8..12].try_into().unwrap());
            let kind = u32::from_be_bytes(rest[12..16].try_into().unwrap());
            let len = u32::from_be_bytes(rest[16..20].try_into().unwrap()) as usize;
            assert!(rest.len() >= 20 + len, "a reply shorter than it says");
            if kind == REP_ACK {
                assert!(opt == OPT_STARTTLS || opt == OPT_ABORT, "option {opt} acknowledged without TLS");
                last_ack = Some(opt);
            } else {
                assert!(kind & (1 << 31) != 0, "option {opt} answered {kind:#x} without TLS");
            }
            rest = &rest[20 + len..];
        }
        if let Ok(true) = r {
            assert_eq!(last_ack, Some(OPT_STARTTLS), "STARTTLS reported but not acknowledged");
        }
    });
});

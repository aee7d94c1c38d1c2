//! The NBD handshake (docs/block.md "NBD"): the greeting, option haggling with STARTTLS,
//! LIST, INFO and GO on behalf of the connection's user, until a volume is open.

// NBD is big-endian on the wire.
#![allow(clippy::big_endian_bytes)]

use super::access::Who;
use super::proto::*;
use super::{NbdServer, Session, invalid};
use std::net::SocketAddr;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The transmission flags of an export (read-only for a user with read rights alone).
pub(super) fn tflags(read_only: bool) -> u16 {
    let all = TFLAG_HAS_FLAGS
        | TFLAG_SEND_FLUSH
        | TFLAG_SEND_FUA
        | TFLAG_SEND_TRIM
        | TFLAG_SEND_WRITE_ZEROES
        | TFLAG_CAN_MULTI_CONN;
    if read_only {
        all | TFLAG_READ_ONLY
    } else {
        all
    }
}

/// A client that proved its user has this long from then to opening a volume; then it is
/// closed. (Before that, its slot's `proof_timeout`.)
pub(super) const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// What option haggling settled so far.
pub(super) struct Haggle {
    pub(super) no_zeroes: bool,
    pub(super) structured: bool,
    /// TLS is on.
    pub(super) tls: bool,
    pub(super) who: Who,
    pub(super) peer: SocketAddr,
    /// The client certificate's fingerprint, once TLS is on.
    pub(super) fingerprint: Option<String>,
}

/// How option haggling ended.
pub(super) enum Outcome {
    Session(Session),
    /// The client asked for TLS and was answered: the TLS handshake comes next.
    StartTls,
    Closed,
}

/// The server's greeting and the client's flags.
pub(super) async fn greet(
    io: &mut (impl AsyncRead + AsyncWrite + Unpin),
    h: &mut Haggle,
) -> std::io::Result<()> {
    let mut hello = Vec::with_capacity(18);
    hello.extend_from_slice(&NBDMAGIC.to_be_bytes());
    hello.extend_from_slice(&IHAVEOPT.to_be_bytes());
    hello.extend_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    io.write_all(&hello).await?;
    io.flush().await?;
    let client_flags = io.read_u32().await?;
    if client_flags & !u32::from(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES) != 0 {
        return Err(invalid("unknown client flags"));
    }
    h.no_zeroes = client_flags & u32::from(FLAG_NO_ZEROES) != 0;
    Ok(())
}

/// Reads one option (header and data); one longer than [`MAX_OPTION`] is skipped unread and
/// answered `ERR_TOO_BIG` (`None`).
pub(super) async fn read_option(
    io: &mut (impl AsyncRead + AsyncWrite + Unpin),
) -> std::io::Result<Option<(u32, Vec<u8>)>> {
    let mut head = [0u8; 16];
    io.read_exact(&mut head).await?;
    let (opt, len) = option_header(&head).map_err(|e| invalid(&e.to_string()))?;
    if len as usize > MAX_OPTION {
        let mut skip = (&mut *io).take(u64::from(len));
        tokio::io::copy(&mut skip, &mut tokio::io::sink()).await?;
        reply_err(io, opt, REP_ERR_TOO_BIG, "option too long").await?;
        return Ok(None);
    }
    let mut data = vec![0u8; len as usize];
    io.read_exact(&mut data).await?;
    Ok(Some((opt, data)))
}

/// Options on a server that requires TLS, before the client asked for it: `STARTTLS` (no
/// data) is acknowledged and the TLS handshake comes next; `ABORT` ends; `EXPORT_NAME` closes
/// the connection (it has no error reply); every other option is answered `ERR_TLS_REQD`.
/// `refused(exported)` is called for each option refused for want of TLS.
pub(super) async fn until_starttls(
    io: &mut (impl AsyncRead + AsyncWrite + Unpin),
    mut refused: impl FnMut(bool),
) -> std::io::Result<Outcome> {
    loop {
        let Some((opt, data)) = read_option(io).await? else {
            continue;
        };
        match opt {
            OPT_STARTTLS if data.is_empty() => {
                io.write_all(&option_reply(opt, REP_ACK, &[])).await?;
                io.flush().await?;
                return Ok(Outcome::StartTls);
            }
            OPT_STARTTLS => {
                reply_err(io, opt, REP_ERR_INVALID, "STARTTLS takes no data").await?;
            }
            OPT_ABORT => {
                io.write_all(&option_reply(opt, REP_ACK, &[])).await?;
                io.flush().await?;
                return Ok(Outcome::Closed);
            }
            OPT_EXPORT_NAME => {
                refused(true);
                return Ok(Outcome::Closed);
            }
            _ => {
                refused(false);
                reply_err(
                    io,
                    opt,
                    REP_ERR_TLS_REQD,
                    "TLS is required: connect with TLS and a client certificate from `cairn \
                     user cert` (nbds:// URIs)",
                )
                .await?;
            }
        }
    }
}

/// The handshake of a server that requires TLS, up to the TLS handshake, for the fuzzer
/// (`fuzz/fuzz_targets/nbd_starttls.rs`): the greeting, the client's flags, then options
/// until STARTTLS. `Ok(true)`: STARTTLS was acknowledged.
///
/// # Errors
/// What the client sent broke the protocol, or the stream ended.
#[doc(hidden)]
pub async fn starttls_handshake(
    io: &mut (impl AsyncRead + AsyncWrite + Unpin),
) -> std::io::Result<bool> {
    let mut h = Haggle {
        no_zeroes: false,
        structured: false,
        tls: false,
        who: Who::Unproven,
        peer: SocketAddr::from(([127, 0, 0, 1], 0)),
        fingerprint: None,
    };
    greet(io, &mut h).await?;
    Ok(matches!(
        until_starttls(io, |_| {}).await?,
        Outcome::StartTls
    ))
}

impl NbdServer {
    /// Option haggling (after [`greet`]) until the client opens a volume, aborts, or — TLS
    /// offered and not yet on — asks for STARTTLS.
    pub(super) async fn haggle(
        &self,
        io: &mut (impl AsyncRead + AsyncWrite + Unpin),
        h: &mut Haggle,
    ) -> std::io::Result<Outcome> {
        if self.opts.tls.is_some() && !h.tls {
            let mut refused = false;
            let o = until_starttls(io, |exported| {
                metrics::counter!("cairn_nbd_refused_total", "why" => "plain").increment(1);
                if exported {
                    tracing::info!("EXPORT_NAME without TLS: closed (TLS is required)");
                }
                refused = true;
            })
            .await;
            if refused {
                // Once per connection, however many options it tried.
                self.record(h.peer, "connect", None, None, Err("NBD without TLS"));
            }
            return o;
        }
        loop {
            let Some((opt, data)) = read_option(io).await? else {
                continue;
            };
            match opt {
                OPT_EXPORT_NAME => {
                    let name = String::from_utf8_lossy(&data).into_owned();
                    // The protocol has no error reply here: the server closes.
                    let (v, read_only) = match self.open_for(&h.who, &name).await {
                        Ok(x) => x,
                        Err((_, why)) => {
                            tracing::warn!(volume = %name, who = %h.who, error = %why, "export refused");
                            self.record(h.peer, "open", Some(&h.who), Some(&name), Err(&why));
                            return Ok(Outcome::Closed);
                        }
                    };
                    self.record(
                        h.peer,
                        "open",
                        Some(&h.who),
                        Some(&name),
                        Ok(if read_only { "read-only" } else { "read-write" }),
                    );
                    let mut out = Vec::with_capacity(134);
                    out.extend_from_slice(&v.size().to_be_bytes());
                    out.extend_from_slice(&tflags(read_only).to_be_bytes());
                    if !h.no_zeroes {
                        out.extend_from_slice(&[0u8; 124]);
                    }
                    if let Err(e) = async {
                        io.write_all(&out).await?;
                        io.flush().await
                    }
                    .await
                    {
                        self.release(&name).await;
                        return Err(e);
                    }
                    return Ok(Outcome::Session(Session {
                        volume: v,
                        structured: h.structured,
                        read_only,
                        user: h.who.name(),
                        fingerprint: h.fingerprint.clone(),
                    }));
                }
                OPT_ABORT => {
                    io.write_all(&option_reply(opt, REP_ACK, &[])).await?;
                    io.flush().await?;
                    return Ok(Outcome::Closed);
                }
                OPT_LIST => {
                    if !data.is_empty() {
                        reply_err(io, opt, REP_ERR_INVALID, "LIST takes no data").await?;
                        continue;
                    }
                    if let Who::Refused(why) = &h.who {
                        reply_err(io, opt, REP_ERR_POLICY, why).await?;
                        continue;
                    }
                    match self.volumes_for(&h.who).await {
                        Ok(vs) => {
                            // Only what this client may open.
                            for v in &vs {
                                let mut p = Vec::with_capacity(4 + v.name.len());
                                p.extend_from_slice(&(v.name.len() as u32).to_be_bytes());
                                p.extend_from_slice(v.name.as_bytes());
                                io.write_all(&option_reply(opt, REP_SERVER, &p)).await?;
                            }
                            io.write_all(&option_reply(opt, REP_ACK, &[])).await?;
                        }
                        Err(why) => {
                            reply_err(io, opt, REP_ERR_POLICY, &why).await?;
                        }
                    }
                    io.flush().await?;
                }
                OPT_STRUCTURED_REPLY => {
                    if !data.is_empty() {
                        reply_err(io, opt, REP_ERR_INVALID, "STRUCTURED_REPLY takes no data")
                            .await?;
                        continue;
                    }
                    h.structured = true;
                    io.write_all(&option_reply(opt, REP_ACK, &[])).await?;
                    io.flush().await?;
                }
                OPT_INFO | OPT_GO => {
                    let (name, infos) = match info_request(&data) {
                        Ok(x) => x,
                        Err(e) => {
                            reply_err(io, opt, REP_ERR_INVALID, &e.to_string()).await?;
                            continue;
                        }
                    };
                    // INFO describes the volume without opening it; GO opens it.
                    let (size, bs, read_only, vol) = if opt == OPT_GO {
                        match self.open_for(&h.who, &name).await {
                            Ok((v, ro)) => {
                                self.record(
                                    h.peer,
                                    "open",
                                    Some(&h.who),
                                    Some(&name),
                                    Ok(if ro { "read-only" } else { "read-write" }),
                                );
                                (v.size(), v.block_size() as u32, ro, Some(v))
                            }
                            Err((code, why)) => {
                                tracing::warn!(volume = %name, who = %h.who, error = %why, "export refused");
                                self.record(h.peer, "open", Some(&h.who), Some(&name), Err(&why));
                                reply_err(io, opt, code, &why).await?;
                                continue;
                            }
                        }
                    } else {
                        match self.lookup_for(&h.who, &name).await {
                            Ok((m, ro)) => (m.size, m.block_size, ro, None),
                            Err((code, why)) => {
                                reply_err(io, opt, code, &why).await?;
                                continue;
                            }
                        }
                    };
                    let r: std::io::Result<()> = async {
                        let mut p = Vec::with_capacity(12);
                        p.extend_from_slice(&INFO_EXPORT.to_be_bytes());
                        p.extend_from_slice(&size.to_be_bytes());
                        p.extend_from_slice(&tflags(read_only).to_be_bytes());
                        io.write_all(&option_reply(opt, REP_INFO, &p)).await?;
                        let mut p = Vec::with_capacity(14);
                        p.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
                        p.extend_from_slice(&bs.to_be_bytes());
                        p.extend_from_slice(&bs.max(4096).to_be_bytes());
                        p.extend_from_slice(&self.opts.max_request.to_be_bytes());
                        io.write_all(&option_reply(opt, REP_INFO, &p)).await?;
                        if infos.contains(&INFO_NAME) {
                            let mut p = INFO_NAME.to_be_bytes().to_vec();
                            p.extend_from_slice(name.as_bytes());
                            io.write_all(&option_reply(opt, REP_INFO, &p)).await?;
                        }
                        if infos.contains(&INFO_DESCRIPTION) {
                            let mut p = INFO_DESCRIPTION.to_be_bytes().to_vec();
                            p.extend_from_slice(b"cairn volume");
                            io.write_all(&option_reply(opt, REP_INFO, &p)).await?;
                        }
                        io.write_all(&option_reply(opt, REP_ACK, &[])).await?;
                        io.flush().await
                    }
                    .await;
                    if let Err(e) = r {
                        if vol.is_some() {
                            self.release(&name).await;
                        }
                        return Err(e);
                    }
                    if let Some(volume) = vol {
                        return Ok(Outcome::Session(Session {
                            volume,
                            structured: h.structured,
                            read_only,
                            user: h.who.name(),
                            fingerprint: h.fingerprint.clone(),
                        }));
                    }
                }
                OPT_STARTTLS if h.tls => {
                    reply_err(io, opt, REP_ERR_INVALID, "TLS is already on").await?;
                }
                OPT_STARTTLS => {
                    reply_err(io, opt, REP_ERR_POLICY, "TLS is not offered on this server").await?;
                }
                _ => {
                    reply_err(io, opt, REP_ERR_UNSUP, "unknown option").await?;
                }
            }
        }
    }
}

pub(super) async fn reply_err(
    wr: &mut (impl AsyncWrite + Unpin),
    opt: u32,
    code: u32,
    why: &str,
) -> std::io::Result<()> {
    wr.write_all(&option_reply(opt, code, why.as_bytes()))
        .await?;
    wr.flush().await
}

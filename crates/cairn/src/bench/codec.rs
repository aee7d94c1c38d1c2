//! `cairn bench codec`: the erasure codec and LZ4 blocks on one core, next to the floor of
//! the same run — copying the same bytes (memcpy of the stripe's data cells), what any codec
//! must at least do to touch its input and produce output.
//!
//! Encode: K data cells → M parity cells. Decode: the stripe with M data cells lost (the
//! worst case: the decoder restores data, not just parity). Figures are user (data) bytes per
//! second, per core. LZ4: a generated access-log corpus (its compression ratio is printed).

use cairn_ec::{Codec, ReedSolomon, block};
use serde::Serialize;
use std::hint::black_box;
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct Args {
    /// Geometries K+M (default: 4+2, 6+3, 8+3, 8+4).
    #[arg(long = "geometry", value_parser = parse_geometry)]
    geometries: Vec<(usize, usize)>,
    /// Bytes per cell.
    #[arg(long, default_value = "64k", value_parser = super::parse_size)]
    cell: u64,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 1.0)]
    seconds: f64,
    /// LZ4 block size.
    #[arg(long, default_value = "64k", value_parser = super::parse_size)]
    lz4_block: u64,
}

fn parse_geometry(s: &str) -> Result<(usize, usize), String> {
    let (k, m) = s.split_once('+').ok_or("expected K+M, e.g. 4+2")?;
    Ok((
        k.parse().map_err(|_| "K: not a number")?,
        m.parse().map_err(|_| "M: not a number")?,
    ))
}

#[derive(Serialize)]
struct CodecReport {
    op: &'static str,
    k: usize,
    m: usize,
    cell: u64,
    encode_gib_s: f64,
    decode_gib_s: f64,
    floor: &'static str,
    floor_gib_s: f64,
    encode_ratio: f64,
    decode_ratio: f64,
    loadavg: f64,
}

#[derive(Serialize)]
struct Lz4Report {
    op: &'static str,
    block: u64,
    corpus_bytes: usize,
    compression_ratio: f64,
    compress_gib_s: f64,
    decompress_gib_s: f64,
    floor: &'static str,
    floor_gib_s: f64,
    compress_ratio_to_floor: f64,
    decompress_ratio_to_floor: f64,
    loadavg: f64,
}

/// Runs `f` (which handles `bytes` user bytes) for about `seconds`; returns GiB/s.
fn rate(seconds: f64, bytes: usize, mut f: impl FnMut()) -> f64 {
    f(); // warm: working space allocated, caches filled
    let until = Duration::from_secs_f64(seconds);
    let t0 = Instant::now();
    let mut n = 0u64;
    while t0.elapsed() < until {
        f();
        n += 1;
    }
    n as f64 * bytes as f64 / t0.elapsed().as_secs_f64() / f64::from(1 << 30)
}

fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Access-log lines with varying fields: compresses like real logs (≈ 3–5×), not like
/// repeated text.
pub fn log_corpus(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut next = move |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    };
    let paths = [
        "/api/v1/items",
        "/api/v1/users",
        "/static/app.js",
        "/login",
        "/api/v2/orders",
    ];
    let agents = [
        "curl/8.5.0",
        "Mozilla/5.0 (X11; Linux x86_64)",
        "python-requests/2.32",
        "Go-http-client/1.1",
    ];
    let mut out = Vec::with_capacity(len + 256);
    let mut t = 1_700_000_000u64;
    while out.len() < len {
        t += next(3);
        let line = format!(
            "10.{}.{}.{} - - [{t}] \"GET {}/{} HTTP/1.1\" {} {} \"{}\" rt={}.{:03}\n",
            next(256),
            next(256),
            next(256),
            paths[next(paths.len() as u64) as usize],
            next(100_000),
            [200, 200, 200, 304, 404, 500][next(6) as usize],
            next(50_000),
            agents[next(agents.len() as u64) as usize],
            next(3),
            next(1000),
        );
        out.extend_from_slice(line.as_bytes());
    }
    out.truncate(len);
    out
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let geometries = if a.geometries.is_empty() {
        vec![(4, 2), (6, 3), (8, 3), (8, 4)]
    } else {
        a.geometries.clone()
    };
    let cell = a.cell as usize;
    anyhow::ensure!(
        cell > 0 && cell.is_multiple_of(cairn_ec::CELL_ALIGN),
        "--cell must be a multiple of {} bytes",
        cairn_ec::CELL_ALIGN
    );
    for (k, m) in geometries {
        let rs = ReedSolomon::new(k, m)?;
        let data: Vec<Vec<u8>> = (0..k).map(|i| noise(cell, i as u64 + 7)).collect();
        let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
        let mut parity = vec![vec![0u8; cell]; m];
        let user = k * cell;
        // Floor: copy the stripe's data bytes once.
        let mut dst = vec![0u8; user];
        let floor = rate(a.seconds, user, || {
            for (i, d) in data.iter().enumerate() {
                dst[i * cell..(i + 1) * cell].copy_from_slice(black_box(d));
            }
            black_box(&dst);
        });
        let encode = rate(a.seconds, user, || {
            let mut p: Vec<&mut [u8]> = parity.iter_mut().map(Vec::as_mut_slice).collect();
            rs.encode_into(black_box(&refs), &mut p).expect("encode");
        });
        let all: Vec<Vec<u8>> = data.iter().chain(&parity).cloned().collect();
        let decode = rate(a.seconds, user, || {
            let mut cells: Vec<Option<Vec<u8>>> = all
                .iter()
                .enumerate()
                .map(|(i, c)| (i >= m).then(|| c.clone()))
                .collect();
            rs.reconstruct(&mut cells).expect("decode");
            black_box(&cells);
        });
        // The decode loop also clones the K surviving cells (the caller owns its buffers):
        // time that alone and take it out, so the figure is the codec's.
        let clone_only = rate(a.seconds, user, || {
            let cells: Vec<Option<Vec<u8>>> = all
                .iter()
                .enumerate()
                .map(|(i, c)| (i >= m).then(|| c.clone()))
                .collect();
            black_box(&cells);
        });
        let decode = 1.0 / (1.0 / decode - 1.0 / clone_only).max(1e-12);
        // The decoded cells must be the originals (a benchmark of wrong answers is no figure).
        let mut check: Vec<Option<Vec<u8>>> = all
            .iter()
            .enumerate()
            .map(|(i, c)| (i >= m).then(|| c.clone()))
            .collect();
        rs.reconstruct(&mut check)?;
        anyhow::ensure!(
            check.iter().zip(&all).all(|(c, a)| c.as_ref() == Some(a)),
            "decode of {k}+{m} returned wrong cells"
        );
        let r = CodecReport {
            op: "ec",
            k,
            m,
            cell: a.cell,
            encode_gib_s: encode,
            decode_gib_s: decode,
            floor: "memcpy of the stripe's data cells",
            floor_gib_s: floor,
            encode_ratio: encode / floor,
            decode_ratio: decode / floor,
            loadavg: super::loadavg(),
        };
        println!("{}", serde_json::to_string(&r)?);
    }

    let corpus = log_corpus(16 << 20, 42);
    let bs = a.lz4_block as usize;
    anyhow::ensure!(
        bs <= block::MAX_BLOCK,
        "--lz4-block over {}",
        block::MAX_BLOCK
    );
    let mut packed = Vec::with_capacity(corpus.len());
    for c in corpus.chunks(bs) {
        block::encode(c, &mut packed);
    }
    let mut back = Vec::with_capacity(corpus.len());
    let mut off = 0;
    while off < packed.len() {
        off += block::decode(&packed[off..], &mut back)?;
    }
    anyhow::ensure!(back == corpus, "LZ4 blocks did not decode to the corpus");
    let mut dst = vec![0u8; corpus.len()];
    let floor = rate(a.seconds, corpus.len(), || {
        dst.copy_from_slice(black_box(&corpus));
        black_box(&dst);
    });
    let mut out = Vec::with_capacity(packed.len() * 2);
    let compress = rate(a.seconds, corpus.len(), || {
        out.clear();
        for c in corpus.chunks(bs) {
            block::encode(c, &mut out);
        }
        black_box(&out);
    });
    let decompress = rate(a.seconds, corpus.len(), || {
        back.clear();
        let mut off = 0;
        while off < packed.len() {
            off += block::decode(&packed[off..], &mut back).expect("decode");
        }
        black_box(&back);
    });
    let r = Lz4Report {
        op: "lz4",
        block: a.lz4_block,
        corpus_bytes: corpus.len(),
        compression_ratio: corpus.len() as f64 / packed.len() as f64,
        compress_gib_s: compress,
        decompress_gib_s: decompress,
        floor: "memcpy of the corpus",
        floor_gib_s: floor,
        compress_ratio_to_floor: compress / floor,
        decompress_ratio_to_floor: decompress / floor,
        loadavg: super::loadavg(),
    };
    println!("{}", serde_json::to_string(&r)?);
    Ok(())
}

//! The erasure codec: K data cells of a stripe give M parity cells, and any K of the K+M cells
//! give back the rest. Cairn's code talks to the [`Codec`] trait; [`ReedSolomon`] implements
//! it with reed-solomon-simd (Leopard-RS over GF(2^16), SIMD where the CPU has it).

use std::cell::RefCell;

/// Cells are a multiple of this many bytes (reed-solomon-simd works on 64-byte lanes; the
/// stripe layout uses multiples of 4 KiB anyway).
pub const CELL_ALIGN: usize = 64;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    #[error("unsupported geometry {k}+{m}")]
    Geometry { k: usize, m: usize },
    #[error("{got} cells given, the stripe has {want}")]
    CellCount { got: usize, want: usize },
    #[error("cell of {got} bytes, expected {want} (a non-zero multiple of {CELL_ALIGN})")]
    CellLength { got: usize, want: usize },
    #[error("only {present} cells of the stripe are readable, {needed} are needed")]
    TooFewCells { present: usize, needed: usize },
    #[error("codec: {0}")]
    Internal(String),
}

/// An erasure code over stripes of `data()` data cells and `parity()` parity cells, all of
/// one length. Cell `i < K` is data cell `i`; cell `K + j` is parity cell `j`.
pub trait Codec: Send + Sync + std::fmt::Debug {
    /// K.
    fn data(&self) -> usize;
    /// M.
    fn parity(&self) -> usize;

    /// Computes the M parity cells of the stripe whose K data cells are `data`.
    fn encode_into(&self, data: &[&[u8]], parity: &mut [&mut [u8]]) -> Result<(), CodecError>;

    /// Fills every missing cell (`None`) of a stripe of K+M cells from the present ones. At
    /// least K must be present; fewer is [`CodecError::TooFewCells`] and changes nothing.
    fn reconstruct(&self, cells: &mut [Option<Vec<u8>>]) -> Result<(), CodecError>;

    /// The parity cells of `data`, allocated.
    fn encode(&self, data: &[&[u8]]) -> Result<Vec<Vec<u8>>, CodecError> {
        let len = data.first().map_or(0, |d| d.len());
        let mut parity = vec![vec![0u8; len]; self.parity()];
        let mut refs: Vec<&mut [u8]> = parity.iter_mut().map(Vec::as_mut_slice).collect();
        self.encode_into(data, &mut refs)?;
        Ok(parity)
    }
}

/// Reed-Solomon with reed-solomon-simd. Encoders and decoders keep working space; each thread
/// keeps one of each and resets it for the geometry at hand (no allocation once warm).
#[derive(Debug, Clone, Copy)]
pub struct ReedSolomon {
    k: usize,
    m: usize,
}

thread_local! {
    static ENCODER: RefCell<Option<reed_solomon_simd::ReedSolomonEncoder>> =
        const { RefCell::new(None) };
    static DECODER: RefCell<Option<reed_solomon_simd::ReedSolomonDecoder>> =
        const { RefCell::new(None) };
}

fn internal(e: reed_solomon_simd::Error) -> CodecError {
    CodecError::Internal(e.to_string())
}

impl ReedSolomon {
    /// The largest K + M accepted (placement puts every cell on its own server).
    pub const MAX_CELLS: usize = 64;

    pub fn new(k: usize, m: usize) -> Result<Self, CodecError> {
        if k == 0 || m == 0 || k + m > Self::MAX_CELLS {
            return Err(CodecError::Geometry { k, m });
        }
        Ok(Self { k, m })
    }

    fn check_len(&self, len: usize, want: usize) -> Result<(), CodecError> {
        if len != want || len == 0 || !len.is_multiple_of(CELL_ALIGN) {
            return Err(CodecError::CellLength { got: len, want });
        }
        Ok(())
    }
}

impl Codec for ReedSolomon {
    fn data(&self) -> usize {
        self.k
    }

    fn parity(&self) -> usize {
        self.m
    }

    fn encode_into(&self, data: &[&[u8]], parity: &mut [&mut [u8]]) -> Result<(), CodecError> {
        if data.len() != self.k {
            return Err(CodecError::CellCount {
                got: data.len(),
                want: self.k,
            });
        }
        if parity.len() != self.m {
            return Err(CodecError::CellCount {
                got: parity.len(),
                want: self.m,
            });
        }
        let len = data[0].len();
        for d in data {
            self.check_len(d.len(), len)?;
        }
        for p in parity.iter() {
            self.check_len(p.len(), len)?;
        }
        ENCODER.with_borrow_mut(|slot| {
            let enc = match slot {
                Some(e) => {
                    e.reset(self.k, self.m, len).map_err(internal)?;
                    e
                }
                None => slot.insert(
                    reed_solomon_simd::ReedSolomonEncoder::new(self.k, self.m, len)
                        .map_err(internal)?,
                ),
            };
            for d in data {
                enc.add_original_shard(d).map_err(internal)?;
            }
            let out = enc.encode().map_err(internal)?;
            for (p, r) in parity.iter_mut().zip(out.recovery_iter()) {
                p.copy_from_slice(r);
            }
            Ok(())
        })
    }

    fn reconstruct(&self, cells: &mut [Option<Vec<u8>>]) -> Result<(), CodecError> {
        let (k, m) = (self.k, self.m);
        if cells.len() != k + m {
            return Err(CodecError::CellCount {
                got: cells.len(),
                want: k + m,
            });
        }
        let present = cells.iter().filter(|c| c.is_some()).count();
        if present < k {
            return Err(CodecError::TooFewCells { present, needed: k });
        }
        let len = cells.iter().flatten().next().map_or(0, Vec::len);
        for c in cells.iter().flatten() {
            self.check_len(c.len(), len)?;
        }
        if present == k + m {
            return Ok(());
        }
        if cells[..k].iter().any(Option::is_none) {
            let restored: Vec<(usize, Vec<u8>)> = DECODER.with_borrow_mut(|slot| {
                let dec = match slot {
                    Some(d) => {
                        d.reset(k, m, len).map_err(internal)?;
                        d
                    }
                    None => slot.insert(
                        reed_solomon_simd::ReedSolomonDecoder::new(k, m, len).map_err(internal)?,
                    ),
                };
                // Any K cells do; data cells first (they cost nothing to "restore").
                let mut added = 0;
                for (i, c) in cells.iter().enumerate() {
                    let Some(c) = c else { continue };
                    if added == k {
                        break;
                    }
                    if i < k {
                        dec.add_original_shard(i, c).map_err(internal)?;
                    } else {
                        dec.add_recovery_shard(i - k, c).map_err(internal)?;
                    }
                    added += 1;
                }
                let out = dec.decode().map_err(internal)?;
                Ok::<_, CodecError>(
                    out.restored_original_iter()
                        .map(|(i, d)| (i, d.to_vec()))
                        .collect(),
                )
            })?;
            for (i, d) in restored {
                cells[i] = Some(d);
            }
            if let Some(i) = cells[..k].iter().position(Option::is_none) {
                return Err(CodecError::Internal(format!("data cell {i} not restored")));
            }
        }
        if cells[k..].iter().any(Option::is_none) {
            let data: Vec<&[u8]> = cells[..k].iter().flatten().map(Vec::as_slice).collect();
            let parity = self.encode(&data)?;
            for (slot, p) in cells[k..].iter_mut().zip(parity) {
                if slot.is_none() {
                    *slot = Some(p);
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stripe(k: usize, len: usize, seed: u8) -> Vec<Vec<u8>> {
        (0..k)
            .map(|i| {
                (0..len)
                    .map(|j| (j as u8).wrapping_mul(31).wrapping_add(seed ^ i as u8))
                    .collect()
            })
            .collect()
    }

    #[test]
    fn any_k_cells_give_back_the_stripe() {
        for (k, m) in [(4, 2), (6, 3), (8, 3), (8, 4), (2, 1)] {
            let rs = ReedSolomon::new(k, m).unwrap();
            let data = stripe(k, 4096, k as u8);
            let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
            let parity = rs.encode(&refs).unwrap();
            let all: Vec<Vec<u8>> = data.iter().chain(&parity).cloned().collect();
            // Every set of m erasures (all of them for small geometries, a spread otherwise).
            for mask in 0u64..(1 << (k + m)) {
                if mask.count_ones() as usize != m || (k + m > 9 && mask % 7 != 0) {
                    continue;
                }
                let mut cells: Vec<Option<Vec<u8>>> = all
                    .iter()
                    .enumerate()
                    .map(|(i, c)| (mask & (1 << i) == 0).then(|| c.clone()))
                    .collect();
                rs.reconstruct(&mut cells).unwrap();
                let got: Vec<Vec<u8>> = cells.into_iter().map(Option::unwrap).collect();
                assert_eq!(got, all, "{k}+{m} erasing {mask:b}");
            }
        }
    }

    #[test]
    fn more_erasures_than_parity_are_refused_and_change_nothing() {
        let rs = ReedSolomon::new(4, 2).unwrap();
        let data = stripe(4, 128, 9);
        let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
        let parity = rs.encode(&refs).unwrap();
        let mut cells: Vec<Option<Vec<u8>>> =
            data.iter().chain(&parity).cloned().map(Some).collect();
        cells[0] = None;
        cells[3] = None;
        cells[5] = None;
        let before = cells.clone();
        assert_eq!(
            rs.reconstruct(&mut cells),
            Err(CodecError::TooFewCells {
                present: 3,
                needed: 4
            })
        );
        assert_eq!(cells, before);
    }

    #[test]
    fn bad_shapes_are_typed_errors() {
        assert!(ReedSolomon::new(0, 2).is_err());
        assert!(ReedSolomon::new(4, 0).is_err());
        assert!(ReedSolomon::new(60, 5).is_err());
        let rs = ReedSolomon::new(4, 2).unwrap();
        let d = [0u8; 100];
        let refs = [&d[..], &d[..], &d[..], &d[..]];
        assert!(matches!(
            rs.encode(&refs),
            Err(CodecError::CellLength { .. })
        ));
        let d = [0u8; 128];
        assert!(matches!(
            rs.encode(&[&d[..], &d[..]]),
            Err(CodecError::CellCount { got: 2, want: 4 })
        ));
        let mut cells = vec![Some(vec![0u8; 128]); 5];
        assert!(matches!(
            rs.reconstruct(&mut cells),
            Err(CodecError::CellCount { got: 5, want: 6 })
        ));
        let mut cells = vec![Some(vec![0u8; 128]); 6];
        cells[2] = Some(vec![0u8; 192]);
        assert!(matches!(
            rs.reconstruct(&mut cells),
            Err(CodecError::CellLength { .. })
        ));
    }
}

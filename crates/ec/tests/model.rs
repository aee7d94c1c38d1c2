//! The codec and the stripe layout against naive models: any K of K+M cells give back the
//! stripe, more erasures are refused; the layout puts every user byte where the plain formula
//! says; a whole chunk group written through the layout and codec reads back after losing
//! any M of its chunks.

use cairn_ec::{Codec, CodecError, ReedSolomon, StripeLayout};
use proptest::prelude::*;

fn geometry() -> impl Strategy<Value = (usize, usize, usize)> {
    (2usize..=8, 1usize..=4, 1usize..=8).prop_map(|(k, m, c)| (k, m, c * 64))
}

/// Where user byte `p` lives: (data chunk, offset in it).
fn naive(l: &StripeLayout, p: u64) -> (u32, u64) {
    let (k, cell) = (u64::from(l.k), u64::from(l.cell));
    (((p / cell) % k) as u32, (p / (k * cell)) * cell + p % cell)
}

proptest! {
    #[test]
    fn any_k_cells_decode_and_fewer_are_refused(
        (k, m, cell) in geometry(),
        seed in any::<u64>(),
        erase in proptest::collection::vec(any::<prop::sample::Index>(), 0..8),
    ) {
        let rs = ReedSolomon::new(k, m).unwrap();
        let mut x = seed | 1;
        let data: Vec<Vec<u8>> = (0..k).map(|_| (0..cell).map(|_| { x ^= x << 13; x ^= x >> 7; x ^= x << 17; x as u8 }).collect()).collect();
        let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
        let parity = rs.encode(&refs).unwrap();
        let all: Vec<Vec<u8>> = data.iter().chain(&parity).cloned().collect();
        let mut cells: Vec<Option<Vec<u8>>> = all.iter().cloned().map(Some).collect();
        for e in &erase {
            cells[e.index(k + m)] = None;
        }
        let erased = cells.iter().filter(|c| c.is_none()).count();
        let before = cells.clone();
        match rs.reconstruct(&mut cells) {
            Ok(()) => {
                prop_assert!(erased <= m);
                let got: Vec<Vec<u8>> = cells.into_iter().map(Option::unwrap).collect();
                prop_assert_eq!(got, all);
            }
            Err(CodecError::TooFewCells { present, needed }) => {
                prop_assert!(erased > m);
                prop_assert_eq!((present, needed), (k + m - erased, k));
                prop_assert_eq!(cells, before);
            }
            Err(e) => prop_assert!(false, "unexpected {e}"),
        }
    }

    #[test]
    fn layout_matches_the_formula((k, m, cell) in geometry(), off in 0u64..100_000, len in 0u64..20_000) {
        let l = StripeLayout::new(k as u32, m as u32, cell as u32).unwrap();
        let mut at = 0;
        for p in l.pieces(off, len) {
            prop_assert_eq!(p.at, at);
            prop_assert!(p.len > 0 && p.chunk < l.k);
            for b in [0, p.len - 1] {
                prop_assert_eq!(naive(&l, off + p.at + b), (p.chunk, p.chunk_offset + b));
            }
            // A piece never crosses a cell.
            prop_assert_eq!(p.chunk_offset / u64::from(l.cell), (p.chunk_offset + p.len - 1) / u64::from(l.cell));
            at += p.len;
        }
        prop_assert_eq!(at, len);
    }

    #[test]
    fn a_chunk_group_survives_any_m_lost_chunks(
        (k, m, cell) in geometry(),
        stripes in 1u64..4,
        lost in proptest::collection::btree_set(0usize..12, 0..5),
        off in 0u64..10_000, len in 1u64..10_000,
    ) {
        let l = StripeLayout::new(k as u32, m as u32, cell as u32).unwrap();
        let rs = ReedSolomon::new(k, m).unwrap();
        let user: Vec<u8> = (0..stripes * l.stripe_bytes()).map(|i| (i * 7 + i / 251) as u8).collect();
        // Write: each stripe's cells appended to the K+M chunks.
        let mut chunks = vec![Vec::new(); k + m];
        for s in user.chunks(l.stripe_bytes() as usize) {
            let cells = l.cells(s);
            let parity = rs.encode(&cells).unwrap();
            for (i, c) in cells.iter().copied().chain(parity.iter().map(Vec::as_slice)).enumerate() {
                chunks[i].extend_from_slice(c);
            }
        }
        for c in &chunks {
            prop_assert_eq!(c.len() as u64, l.chunk_len(stripes));
        }
        let lost: Vec<usize> = lost.into_iter().filter(|&i| i < k + m).collect();
        // Rebuild the lost chunks stripe by stripe (what repair does), if there are K left.
        let mut rebuilt = vec![Vec::new(); k + m];
        let mut refused = false;
        for s in 0..stripes as usize {
            let mut cells: Vec<Option<Vec<u8>>> = (0..k + m)
                .map(|i| (!lost.contains(&i)).then(|| chunks[i][s * cell..(s + 1) * cell].to_vec()))
                .collect();
            match rs.reconstruct(&mut cells) {
                Ok(()) => for (i, c) in cells.into_iter().enumerate() { rebuilt[i].extend(c.unwrap()) },
                Err(_) => { refused = true; break }
            }
        }
        prop_assert_eq!(refused, lost.len() > m);
        if !refused {
            prop_assert_eq!(&rebuilt, &chunks);
            // Any user range reads back from the data chunks through the layout.
            let (off, len) = (off % user.len() as u64, len.min(user.len() as u64 - off % user.len() as u64));
            let mut got = vec![0u8; len as usize];
            for p in l.pieces(off, len) {
                let src = &rebuilt[p.chunk as usize][p.chunk_offset as usize..][..p.len as usize];
                got[p.at as usize..][..p.len as usize].copy_from_slice(src);
            }
            prop_assert_eq!(&got[..], &user[off as usize..][..len as usize]);
        }
    }
}

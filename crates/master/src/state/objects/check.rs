//! The object index's part of the consistency check (state/check.rs): every object in a
//! bucket that exists, its extents adding up to its size and naming files that hold them
//! (sealed files hold them whole), every part in an upload that exists, the packs' live
//! bytes and counts equal to what objects and parts name, and no file in the trash that
//! something still names.

use super::super::State;
use super::super::check::Report;
use super::PackUse;
use cairn_rpc::object::Extent;
use std::collections::{BTreeMap, BTreeSet};

impl State {
    pub(in crate::state) fn check_objects(&self, r: &mut Report) {
        let mut packs: BTreeMap<String, PackUse> = BTreeMap::new();
        let mut named: BTreeSet<String> = BTreeSet::new();
        let mut extent = |r: &mut Report, what: &str, e: &Extent| {
            named.insert(e.path.clone());
            if e.shared {
                let u = packs.entry(e.path.clone()).or_default();
                u.live_bytes += e.len;
                u.live_objects += 1;
            }
            match self.lookup_here(&e.path) {
                Some(ino) => match ino.file() {
                    Some(f) if f.sealed && e.offset + e.len > f.committed_length() => {
                        r.problem(format!(
                            "{what}: bytes {}..{} of {}, which holds {}",
                            e.offset,
                            e.offset + e.len,
                            e.path,
                            f.committed_length()
                        ));
                    }
                    Some(_) => {}
                    None => r.problem(format!("{what}: its data {} is a directory", e.path)),
                },
                None => r.problem(format!("{what}: its data {} is missing", e.path)),
            }
        };
        for ((bucket, key), o) in self.objects.by_key.iter() {
            r.objects += 1;
            let what = format!("object {bucket}/{key}");
            match self.objects.buckets.get(&bucket) {
                None => r.problem(format!("{what}: no bucket {bucket}")),
                // The root holds no object of a bucket it placed in shards (buckets.rs).
                Some(_) if !self.objects.shards_of(&bucket).is_empty() => r.problem(format!(
                    "{what}: the bucket's objects are in partitions {:?}",
                    self.objects.shards_of(&bucket)
                )),
                Some(_) => {}
            }
            let total: u64 = o.extents.iter().map(|e| e.len).sum();
            if total != o.size {
                r.problem(format!(
                    "{what}: extents of {total} bytes for a size of {}",
                    o.size
                ));
            }
            for e in &o.extents {
                extent(r, &what, e);
            }
        }
        for ((id, n), part) in self.objects.parts.iter() {
            let what = format!("part {n} of upload {id}");
            if !self.objects.uploads.contains_key(&id) {
                r.problem(format!("{what}: no such upload"));
            }
            extent(r, &what, &part.extent);
        }
        for (path, stored) in self.objects.packs.iter() {
            let counted = packs.remove(&path).unwrap_or_default();
            if *stored != counted {
                r.problem(format!(
                    "pack {path}: {} live bytes in {} extents stored, {} in {} named",
                    stored.live_bytes,
                    stored.live_objects,
                    counted.live_bytes,
                    counted.live_objects
                ));
            }
        }
        for (path, counted) in packs {
            r.problem(format!(
                "pack {path}: {} live bytes in {} extents named, no usage stored",
                counted.live_bytes, counted.live_objects
            ));
        }
        for (path, ()) in self.objects.trash.iter().map(|(k, v)| (k, *v)) {
            if named.contains(&path) {
                r.problem(format!("{path} is in the trash and still named"));
            }
        }
    }
}

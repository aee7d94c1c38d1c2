//! What objects name: their extents' files and the packs' live counts. Every object is
//! visible only with its data (an extent's file exists, a shared one's pack is not retired),
//! a replaced version's data is freed, and a pack counts each object that names it once.

use super::super::State;
use cairn_rpc::object::{Extent, ObjectError, ObjectMeta, PutCondition};

impl State {
    /// Makes `meta` the object at `key`, freeing the version it replaces.
    pub(super) fn install(&mut self, bucket: &str, key: &str, meta: ObjectMeta) -> ObjectMeta {
        if let Some(cur) = self.objects.object(bucket, key)
            && cur.put_id == meta.put_id
        {
            // A retry of the PUT that made the current version.
            return (*cur).clone();
        }
        let old = self
            .objects
            .by_key
            .insert((bucket.to_owned(), key.to_owned()), meta.clone());
        for e in &meta.extents {
            self.take_extent(e);
        }
        if let Some(old) = old {
            self.free(&old.extents);
        }
        meta
    }

    /// Every extent's file exists (an object is never visible without its data).
    pub(super) fn check_extents<'a>(
        &self,
        extents: impl Iterator<Item = &'a Extent>,
    ) -> Result<(), ObjectError> {
        for e in extents {
            // Data written for another partition (the gateway's layout is stale).
            if let Err(m) = self.local_components(&e.path) {
                return Err(ObjectError::Moved(m.message));
            }
            // A pack is retired (DropPack) only while no object names it and its writer's
            // lease has lapsed; a writer that appended after that must not make it live
            // again: the trash deletes it after the grace.
            // An own file in the trash was freed by a later version: naming it again (a PUT
            // applied once, replaced, then applied again) would name a file being deleted.
            if self.objects.trash.contains_key(&e.path) {
                return Err(if e.shared {
                    ObjectError::PackRetired(e.path.clone())
                } else {
                    ObjectError::InvalidArgument(format!("data file {} was freed", e.path))
                });
            }
            match self.lookup(&e.path) {
                Ok(ino) if ino.file().is_some() => {}
                _ => {
                    return Err(ObjectError::InvalidArgument(format!(
                        "data file {} is missing",
                        e.path
                    )));
                }
            }
        }
        Ok(())
    }

    /// Counts an extent as live in its pack.
    pub(super) fn take_extent(&mut self, e: &Extent) {
        if e.shared {
            let u = self.objects.packs.get_or_default(&e.path);
            u.live_bytes += e.len;
            u.live_objects += 1;
        }
    }

    /// Undoes [`State::take_extent`] (the extent stays live, counted elsewhere).
    pub(super) fn release_pack(&mut self, e: &Extent) {
        if e.shared
            && let Some(u) = self.objects.packs.get_mut(&e.path)
        {
            u.live_bytes = u.live_bytes.saturating_sub(e.len);
            u.live_objects = u.live_objects.saturating_sub(1);
        }
    }

    /// Frees extents no object or part names any more: their own files go to the trash;
    /// shared bytes become dead in their pack (compaction reclaims them).
    pub(super) fn free(&mut self, extents: &[Extent]) {
        for e in extents {
            if e.shared {
                self.release_pack(e);
            } else {
                self.objects.trash.insert(e.path.clone(), ());
            }
        }
    }
}

/// A conditional PUT's condition against the current version (a retry of the PUT that made
/// the current version passes: its condition held when it first applied).
pub(super) fn check_condition(
    cur: Option<&ObjectMeta>,
    meta: &ObjectMeta,
    condition: &PutCondition,
) -> Result<(), ObjectError> {
    if cur.is_some_and(|c| c.put_id == meta.put_id) {
        return Ok(());
    }
    match (condition, cur) {
        (PutCondition::IfMatch(_), None) => Err(ObjectError::NoSuchKey),
        (PutCondition::IfMatch(e), Some(c)) if e != "*" && *e != c.etag => {
            Err(ObjectError::PreconditionFailed)
        }
        (PutCondition::IfNoneMatch(e), Some(c)) if e == "*" || *e == c.etag => {
            Err(ObjectError::PreconditionFailed)
        }
        _ => Ok(()),
    }
}

pub(super) fn check_meta(meta: &ObjectMeta) -> Result<(), ObjectError> {
    let total: u64 = meta.extents.iter().map(|e| e.len).sum();
    if total != meta.size {
        return Err(ObjectError::InvalidArgument(format!(
            "extents of {total} bytes for an object of {}",
            meta.size
        )));
    }
    if meta.put_id.is_empty() {
        return Err(ObjectError::InvalidArgument("a PUT needs a put id".into()));
    }
    Ok(())
}

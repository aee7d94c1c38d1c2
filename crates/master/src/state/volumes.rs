//! The block service's volumes and their snapshots and clones in the object index
//! (docs/block.md): creation, attributes, resizing, deletion, snapshots.

use super::objects::ObjectIndex;
use cairn_rpc::object::{ObjectError, ObjectOp, OpReply, OpResult, Snapshot, Volume};

/// Snapshots one volume keeps at most.
const MAX_SNAPSHOTS: usize = 256;
/// Clones of clones nest at most this deep (a segment's origin is 16 bits).
const MAX_LINEAGE: usize = 64;

impl ObjectIndex {
    /// Applies a change to the volumes (any other change: an `InvalidArgument`, never sent
    /// here by [`super::State::apply_object`]).
    pub(super) fn apply_volume(&mut self, op: &ObjectOp) -> OpResult {
        let idx = self;
        match op {
            ObjectOp::CreateVolume { volume } => {
                let v = volume;
                if !cairn_rpc::object::valid_volume_name(&v.name) {
                    return Err(ObjectError::InvalidArgument(format!(
                        "invalid volume name {:?} (1-63 of a-z 0-9 . _ -)",
                        v.name
                    )));
                }
                let bs = u64::from(v.block_size);
                if !v.block_size.is_power_of_two() || !(512..=65536).contains(&v.block_size) {
                    return Err(ObjectError::InvalidArgument(
                        "block size must be a power of two in 512..=64k".into(),
                    ));
                }
                if v.size == 0 || v.size % bs != 0 {
                    return Err(ObjectError::InvalidArgument(format!(
                        "size must be a positive multiple of the block size ({bs})"
                    )));
                }
                if v.id.len() != 16 || !v.id.bytes().all(|c| c.is_ascii_hexdigit()) {
                    return Err(ObjectError::InvalidArgument(
                        "volume id: 16 hex digits".into(),
                    ));
                }
                if idx.volumes.contains_key(&v.name) {
                    return Err(ObjectError::VolumeExists);
                }
                let mut v = Volume {
                    snapshots: Vec::new(),
                    lineage: Vec::new(),
                    ..v.clone()
                };
                // A clone: of a ready snapshot, with its block size, at least its size; its
                // index names the ancestors' segments by their place in the lineage.
                if let Some(p) = &v.parent {
                    let pv = idx
                        .volumes
                        .get(&p.volume)
                        .filter(|pv| pv.id == p.volume_id)
                        .ok_or(ObjectError::NoSuchVolume)?;
                    let snap = pv
                        .snapshot(&p.snapshot)
                        .filter(|s| s.id == p.snapshot_id && s.ready)
                        .ok_or(ObjectError::NoSuchSnapshot)?;
                    if pv.block_size != v.block_size || v.size < snap.size {
                        return Err(ObjectError::InvalidArgument(format!(
                            "a clone has its snapshot's block size ({}) and at least its size ({})",
                            pv.block_size, snap.size
                        )));
                    }
                    if pv.lineage.len() >= MAX_LINEAGE {
                        return Err(ObjectError::InvalidArgument(format!(
                            "clones nest at most {MAX_LINEAGE} deep"
                        )));
                    }
                    v.lineage = std::iter::once(pv.id.clone())
                        .chain(pv.lineage.iter().cloned())
                        .collect();
                }
                idx.volumes.insert(v.name.clone(), v.clone());
                Ok(OpReply::Volume(v))
            }
            ObjectOp::SetVolumeAttr { name, mode, owner } => {
                if mode.is_some_and(|m| m > 0o777) {
                    return Err(ObjectError::InvalidArgument(
                        "a volume's mode is 0..=0o777".into(),
                    ));
                }
                if let Some(o) = owner
                    && !o.is_empty()
                    && idx.user_named(o).is_none()
                {
                    return Err(ObjectError::InvalidArgument(format!("no user {o}")));
                }
                let v = idx.volumes.get_mut(name).ok_or(ObjectError::NoSuchVolume)?;
                if let Some(m) = mode {
                    v.mode = *m;
                }
                if let Some(o) = owner {
                    v.owner.clone_from(o);
                }
                Ok(OpReply::Volume(v.clone()))
            }
            ObjectOp::ResizeVolume { name, size } => {
                let v = idx.volumes.get_mut(name).ok_or(ObjectError::NoSuchVolume)?;
                if *size < v.size {
                    return Err(ObjectError::InvalidArgument(
                        "a volume only grows (shrinking would drop its last blocks)".into(),
                    ));
                }
                if *size % u64::from(v.block_size) != 0 {
                    return Err(ObjectError::InvalidArgument(format!(
                        "size must be a multiple of the block size ({})",
                        v.block_size
                    )));
                }
                v.size = *size;
                Ok(OpReply::Volume(v.clone()))
            }
            ObjectOp::DeleteVolume { name } => {
                let v = idx.volumes.get(name).ok_or(ObjectError::NoSuchVolume)?;
                if !v.snapshots.is_empty() {
                    let names: Vec<&str> = v.snapshots.iter().map(|s| s.name.as_str()).collect();
                    return Err(ObjectError::InUse(format!(
                        "volume {name} has snapshots ({}); delete them first",
                        names.join(", ")
                    )));
                }
                Ok(OpReply::Volume(idx.volumes.remove(name).expect("found")))
            }
            ObjectOp::CreateSnapshot { volume, snapshot } => {
                let v = idx
                    .volumes
                    .get_mut(volume)
                    .ok_or(ObjectError::NoSuchVolume)?;
                if !cairn_rpc::object::valid_volume_name(&snapshot.name) {
                    return Err(ObjectError::InvalidArgument(format!(
                        "invalid snapshot name {:?} (1-63 of a-z 0-9 . _ -)",
                        snapshot.name
                    )));
                }
                if snapshot.id.len() != 16 || !snapshot.id.bytes().all(|c| c.is_ascii_hexdigit()) {
                    return Err(ObjectError::InvalidArgument(
                        "snapshot id: 16 hex digits".into(),
                    ));
                }
                if v.snapshot(&snapshot.name).is_some() {
                    return Err(ObjectError::SnapshotExists);
                }
                if v.snapshots.len() >= MAX_SNAPSHOTS {
                    return Err(ObjectError::InvalidArgument(format!(
                        "a volume has at most {MAX_SNAPSHOTS} snapshots"
                    )));
                }
                v.snapshots.push(Snapshot {
                    size: v.size,
                    ready: false,
                    ..snapshot.clone()
                });
                Ok(OpReply::Volume(v.clone()))
            }
            ObjectOp::SnapshotReady { volume, snapshot } => {
                let v = idx
                    .volumes
                    .get_mut(volume)
                    .ok_or(ObjectError::NoSuchVolume)?;
                let s = v
                    .snapshots
                    .iter_mut()
                    .find(|s| s.name == *snapshot)
                    .ok_or(ObjectError::NoSuchSnapshot)?;
                s.ready = true;
                Ok(OpReply::Volume(v.clone()))
            }
            ObjectOp::DeleteSnapshot { volume, snapshot } => {
                let v = idx.volumes.get(volume).ok_or(ObjectError::NoSuchVolume)?;
                let s = v.snapshot(snapshot).ok_or(ObjectError::NoSuchSnapshot)?;
                if let Some(c) = idx.volumes.values().find(|c| {
                    c.parent
                        .as_ref()
                        .is_some_and(|p| p.volume_id == v.id && p.snapshot_id == s.id)
                }) {
                    return Err(ObjectError::InUse(format!(
                        "volume {} is a clone of {volume}@{snapshot}; delete it first",
                        c.name
                    )));
                }
                let v = idx.volumes.get_mut(volume).expect("found");
                v.snapshots.retain(|s| s.name != *snapshot);
                Ok(OpReply::Volume(v.clone()))
            }
            _ => Err(ObjectError::InvalidArgument("not a volume change".into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{Command, State};
    use cairn_rpc::object::Parent;

    fn op(st: &mut State, op: ObjectOp) -> OpResult {
        st.apply(&Command::Object(Box::new(op)))
            .unwrap()
            .object
            .unwrap()
    }

    fn vol(name: &str, id: &str) -> Volume {
        Volume {
            name: name.into(),
            id: id.into(),
            size: 1 << 20,
            block_size: 4096,
            policy: String::new(),
            created_ms: 1,
            snapshots: Vec::new(),
            parent: None,
            lineage: Vec::new(),
            owner: String::new(),
            mode: 0o600,
        }
    }

    fn snap(name: &str, id: &str) -> Snapshot {
        Snapshot {
            name: name.into(),
            id: id.into(),
            size: 0,
            created_ms: 2,
            ready: true,
        }
    }

    #[test]
    fn snapshots_and_clones_keep_what_depends_on_them() {
        let mut st = State::default();
        let a = "00000000000000aa";
        op(
            &mut st,
            ObjectOp::CreateVolume {
                volume: vol("a", a),
            },
        )
        .unwrap();
        // Recorded not ready, with the volume's size, whatever the caller said.
        let r = op(
            &mut st,
            ObjectOp::CreateSnapshot {
                volume: "a".into(),
                snapshot: snap("s1", "0000000000000001"),
            },
        );
        let Ok(OpReply::Volume(v)) = r else {
            panic!("{r:?}")
        };
        assert_eq!(
            (v.snapshots[0].ready, v.snapshots[0].size),
            (false, 1 << 20)
        );
        let again = ObjectOp::CreateSnapshot {
            volume: "a".into(),
            snapshot: snap("s1", "0000000000000002"),
        };
        assert_eq!(op(&mut st, again), Err(ObjectError::SnapshotExists));
        let mut clone = vol("c", "00000000000000cc");
        clone.parent = Some(Parent {
            volume: "a".into(),
            volume_id: a.into(),
            snapshot: "s1".into(),
            snapshot_id: "0000000000000001".into(),
        });
        // Not ready yet: no clone.
        let mk = |v: &Volume| ObjectOp::CreateVolume { volume: v.clone() };
        assert_eq!(op(&mut st, mk(&clone)), Err(ObjectError::NoSuchSnapshot));
        let ready = ObjectOp::SnapshotReady {
            volume: "a".into(),
            snapshot: "s1".into(),
        };
        op(&mut st, ready).unwrap();
        let mut small = clone.clone();
        small.size = 4096;
        assert!(matches!(
            op(&mut st, mk(&small)),
            Err(ObjectError::InvalidArgument(_))
        ));
        let r = op(&mut st, mk(&clone));
        let Ok(OpReply::Volume(c)) = r else {
            panic!("{r:?}")
        };
        assert_eq!(c.lineage, [a]);
        // A clone of the clone names both ancestors, nearest first.
        let cc = "00000000000000dd";
        let snap_c = ObjectOp::CreateSnapshot {
            volume: "c".into(),
            snapshot: snap("t", "0000000000000003"),
        };
        op(&mut st, snap_c).unwrap();
        let ready_c = ObjectOp::SnapshotReady {
            volume: "c".into(),
            snapshot: "t".into(),
        };
        op(&mut st, ready_c).unwrap();
        let mut grand = vol("d", cc);
        grand.parent = Some(Parent {
            volume: "c".into(),
            volume_id: "00000000000000cc".into(),
            snapshot: "t".into(),
            snapshot_id: "0000000000000003".into(),
        });
        let Ok(OpReply::Volume(d)) = op(&mut st, mk(&grand)) else {
            panic!()
        };
        assert_eq!(d.lineage, ["00000000000000cc", a]);
        // What something depends on is not deleted: a volume with snapshots, a snapshot with
        // clones.
        let del_a = ObjectOp::DeleteVolume { name: "a".into() };
        assert!(matches!(
            op(&mut st, del_a.clone()),
            Err(ObjectError::InUse(_))
        ));
        let del_s1 = ObjectOp::DeleteSnapshot {
            volume: "a".into(),
            snapshot: "s1".into(),
        };
        assert!(matches!(
            op(&mut st, del_s1.clone()),
            Err(ObjectError::InUse(_))
        ));
        op(&mut st, ObjectOp::DeleteVolume { name: "d".into() }).unwrap();
        let del_t = ObjectOp::DeleteSnapshot {
            volume: "c".into(),
            snapshot: "t".into(),
        };
        op(&mut st, del_t).unwrap();
        op(&mut st, ObjectOp::DeleteVolume { name: "c".into() }).unwrap();
        op(&mut st, del_s1).unwrap();
        op(&mut st, del_a).unwrap();
    }
}

//! Redundancy policies between their text form (`cairn_ec::Policy`) and the wire.

use cairn_ec::{Policy, Redundancy};
use cairn_rpc::pb;

/// The wire form of `policy`; `min_copy` 0 lets the masters choose (the least majority).
pub(crate) fn to_pb(policy: &Policy, min_copy: u32) -> pb::Policy {
    let (replicas, ec, then_ec) = match (policy.write, policy.then) {
        (Redundancy::Replicas(n), Some(Redundancy::Ec { k, m })) => (n, Some((k, m)), true),
        (Redundancy::Replicas(n), _) => (n, None, false),
        (Redundancy::Ec { k, m }, _) => (0, Some((k, m)), false),
    };
    pb::Policy {
        replicas: u32::from(replicas),
        compression: policy.lz4,
        min_copy,
        ec_data: ec.map_or(0, |e| u32::from(e.0)),
        ec_parity: ec.map_or(0, |e| u32::from(e.1)),
        then_ec,
    }
}

/// The text form of a policy the masters sent (which they checked).
pub(crate) fn from_pb(p: &pb::Policy) -> Policy {
    let ec = (p.ec_data > 0).then_some(Redundancy::Ec {
        k: p.ec_data as u8,
        m: p.ec_parity as u8,
    });
    let replicas = Redundancy::Replicas(p.replicas.max(1) as u8);
    let (write, then) = match ec {
        Some(e) if p.then_ec => (replicas, Some(e)),
        Some(e) => (e, None),
        None => (replicas, None),
    };
    Policy {
        write,
        then,
        lz4: p.compression,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_survives_the_wire() {
        for s in [
            "replicas:3",
            "replicas:1,lz4",
            "ec:4+2",
            "ec:8+3,lz4",
            "replicas:3,then:ec:6+3",
        ] {
            let p: Policy = s.parse().unwrap();
            assert_eq!(from_pb(&to_pb(&p, 0)).to_string(), s);
        }
    }
}

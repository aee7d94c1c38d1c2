//! Checksums (`x-amz-checksum-*`): what a request declares, what the gateway computes while
//! it stores the body, and a multipart object's checksum made from its parts' (S3's
//! COMPOSITE and FULL_OBJECT types).
//!
//! An object keeps its checksums by algorithm name (`ObjectMeta::checksums`), the type of the
//! one a multipart object has, and its parts' checksums (GET with `partNumber`). They are
//! answered only when the request asks (`x-amz-checksum-mode: ENABLED`), as S3 does.

use crate::data;
use s3s::checksum::ChecksumHasher;
use s3s::crypto::Checksum as _;
use s3s::dto::*;
use s3s::{S3Result, s3_error};
use std::collections::BTreeMap;

/// A hasher for every checksum the request declared or asked for.
pub(crate) fn hasher_for(
    algorithm: Option<&ChecksumAlgorithm>,
    declared: &Checksum,
) -> S3Result<ChecksumHasher> {
    let mut h = ChecksumHasher::default();
    if declared.checksum_crc32.is_some() {
        h.crc32 = Some(Default::default());
    }
    if declared.checksum_crc32c.is_some() {
        h.crc32c = Some(Default::default());
    }
    if declared.checksum_sha1.is_some() {
        h.sha1 = Some(Default::default());
    }
    if declared.checksum_sha256.is_some() {
        h.sha256 = Some(Default::default());
    }
    if declared.checksum_crc64nvme.is_some() {
        h.crc64nvme = Some(Default::default());
    }
    if let Some(a) = algorithm {
        match a.as_str() {
            ChecksumAlgorithm::CRC32 => h.crc32 = Some(Default::default()),
            ChecksumAlgorithm::CRC32C => h.crc32c = Some(Default::default()),
            ChecksumAlgorithm::SHA1 => h.sha1 = Some(Default::default()),
            ChecksumAlgorithm::SHA256 => h.sha256 = Some(Default::default()),
            ChecksumAlgorithm::CRC64NVME => h.crc64nvme = Some(Default::default()),
            other => {
                return Err(s3_error!(
                    InvalidRequest,
                    "unsupported checksum algorithm {other}"
                ));
            }
        }
    }
    Ok(h)
}

/// Checksums sent in trailers (aws-chunked uploads, what current SDKs do by default) join
/// those sent as headers.
pub(crate) fn with_trailers(
    mut declared: Checksum,
    trailers: Option<s3s::TrailingHeaders>,
) -> S3Result<Checksum> {
    let Some(t) = trailers.and_then(|t| t.take()) else {
        return Ok(declared);
    };
    let get = |name: &str| -> S3Result<Option<String>> {
        match t.get(name) {
            Some(v) => Ok(Some(
                v.to_str()
                    .map_err(|_| s3_error!(InvalidArgument, "a checksum trailer is not text"))?
                    .to_owned(),
            )),
            None => Ok(None),
        }
    };
    if let Some(v) = get("x-amz-checksum-crc32")? {
        declared.checksum_crc32 = Some(v);
    }
    if let Some(v) = get("x-amz-checksum-crc32c")? {
        declared.checksum_crc32c = Some(v);
    }
    if let Some(v) = get("x-amz-checksum-sha1")? {
        declared.checksum_sha1 = Some(v);
    }
    if let Some(v) = get("x-amz-checksum-sha256")? {
        declared.checksum_sha256 = Some(v);
    }
    if let Some(v) = get("x-amz-checksum-crc64nvme")? {
        declared.checksum_crc64nvme = Some(v);
    }
    Ok(declared)
}

/// The checksums worth keeping: those computed, by algorithm name.
pub(crate) fn checksum_map(c: &Checksum) -> BTreeMap<String, String> {
    let mut m = BTreeMap::new();
    for (name, v) in [
        ("CRC32", &c.checksum_crc32),
        ("CRC32C", &c.checksum_crc32c),
        ("SHA1", &c.checksum_sha1),
        ("SHA256", &c.checksum_sha256),
        ("CRC64NVME", &c.checksum_crc64nvme),
    ] {
        if let Some(v) = v {
            m.insert(name.to_owned(), v.clone());
        }
    }
    m
}

pub(crate) fn declared(
    crc32: Option<String>,
    crc32c: Option<String>,
    sha1: Option<String>,
    sha256: Option<String>,
    crc64nvme: Option<String>,
) -> Checksum {
    Checksum {
        checksum_crc32: crc32,
        checksum_crc32c: crc32c,
        checksum_sha1: sha1,
        checksum_sha256: sha256,
        checksum_crc64nvme: crc64nvme,
        checksum_type: None,
    }
}

/// The five checksum fields of an answer.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Sums {
    pub crc32: Option<String>,
    pub crc32c: Option<String>,
    pub sha1: Option<String>,
    pub sha256: Option<String>,
    pub crc64nvme: Option<String>,
}

impl Sums {
    /// From a map of algorithm name → value.
    pub fn of(map: &BTreeMap<String, String>) -> Self {
        let get = |a: &str| map.get(a).cloned();
        Self {
            crc32: get("CRC32"),
            crc32c: get("CRC32C"),
            sha1: get("SHA1"),
            sha256: get("SHA256"),
            crc64nvme: get("CRC64NVME"),
        }
    }

    /// One algorithm's value.
    pub fn one(algorithm: &str, value: String) -> Self {
        Self::of(&BTreeMap::from([(algorithm.to_owned(), value)]))
    }

    /// The value declared for `algorithm`.
    pub fn get(&self, algorithm: &str) -> Option<&String> {
        match algorithm {
            "CRC32" => self.crc32.as_ref(),
            "CRC32C" => self.crc32c.as_ref(),
            "SHA1" => self.sha1.as_ref(),
            "SHA256" => self.sha256.as_ref(),
            "CRC64NVME" => self.crc64nvme.as_ref(),
            _ => None,
        }
    }
}

/// `x-amz-checksum-mode: ENABLED` was sent.
pub(crate) fn wanted(mode: Option<&ChecksumMode>) -> bool {
    mode.is_some_and(|m| m.as_str().eq_ignore_ascii_case(ChecksumMode::ENABLED))
}

/// An upload's checksum algorithm and type, from CreateMultipartUpload's headers: CRC64NVME
/// is always FULL_OBJECT, the SHAs always COMPOSITE, the CRC32s COMPOSITE unless asked.
pub(crate) fn upload_checksum(
    algorithm: Option<&ChecksumAlgorithm>,
    kind: Option<&ChecksumType>,
) -> S3Result<(Option<String>, Option<String>)> {
    let Some(a) = algorithm else {
        if kind.is_some() {
            return Err(s3_error!(
                InvalidRequest,
                "x-amz-checksum-type needs x-amz-checksum-algorithm"
            ));
        }
        return Ok((None, None));
    };
    let a = a.as_str().to_ascii_uppercase();
    let full_only = a == "CRC64NVME";
    let composite_only = a == "SHA1" || a == "SHA256";
    if !(full_only || composite_only || a == "CRC32" || a == "CRC32C") {
        return Err(s3_error!(
            InvalidRequest,
            "unsupported checksum algorithm {a}"
        ));
    }
    let k = match kind.map(|k| k.as_str().to_ascii_uppercase()) {
        None if full_only => ChecksumType::FULL_OBJECT.to_owned(),
        None => ChecksumType::COMPOSITE.to_owned(),
        Some(k) if k == ChecksumType::FULL_OBJECT && !composite_only => k,
        Some(k) if k == ChecksumType::COMPOSITE && !full_only => k,
        Some(k) => {
            return Err(s3_error!(
                InvalidRequest,
                "the checksum type {k} is not available for {a}"
            ));
        }
    };
    Ok((Some(a), Some(k)))
}

/// A multipart object's checksum from its parts' (base64 values and sizes, in order).
///
/// COMPOSITE: the algorithm over the concatenated decoded part checksums, base64, `-N`.
/// FULL_OBJECT (the CRCs only): the parts' CRCs combined into the CRC of the whole object.
pub(crate) fn combine(algorithm: &str, kind: &str, parts: &[(String, u64)]) -> S3Result<String> {
    let decoded = parts
        .iter()
        .map(|(v, _)| {
            data::base64_decode(v).ok_or_else(|| {
                s3_error!(InvalidPart, "a part's {algorithm} checksum is not base64")
            })
        })
        .collect::<S3Result<Vec<Vec<u8>>>>()?;
    let b64 = |b: &[u8]| base64_simd::STANDARD.encode_to_string(b);
    if kind == ChecksumType::COMPOSITE {
        let all: Vec<u8> = decoded.concat();
        let digest: Vec<u8> = match algorithm {
            "CRC32" => s3s::crypto::Crc32::checksum(&all).to_vec(),
            "CRC32C" => s3s::crypto::Crc32c::checksum(&all).to_vec(),
            "SHA1" => s3s::crypto::Sha1::checksum(&all).to_vec(),
            "SHA256" => s3s::crypto::Sha256::checksum(&all).to_vec(),
            other => {
                return Err(s3_error!(
                    InvalidRequest,
                    "{other} has no composite checksum"
                ));
            }
        };
        return Ok(format!("{}-{}", b64(&digest), parts.len()));
    }
    let (crc, width) = match algorithm {
        "CRC32" => (crc_fast::CrcAlgorithm::Crc32IsoHdlc, 4),
        "CRC32C" => (crc_fast::CrcAlgorithm::Crc32Iscsi, 4),
        "CRC64NVME" => (crc_fast::CrcAlgorithm::Crc64Nvme, 8),
        other => {
            return Err(s3_error!(
                InvalidRequest,
                "{other} has no full-object checksum of parts"
            ));
        }
    };
    let mut acc: Option<u64> = None;
    for (bytes, (_, size)) in decoded.iter().zip(parts) {
        if bytes.len() != width {
            return Err(s3_error!(
                InvalidPart,
                "a part's {algorithm} checksum is not {width} bytes"
            ));
        }
        let v = bytes.iter().fold(0u64, |a, b| (a << 8) | u64::from(*b));
        acc = Some(match acc {
            None => v,
            Some(a) => crc_fast::checksum_combine(crc, a, v, *size),
        });
    }
    let v = acc.ok_or_else(|| s3_error!(MalformedXML, "no parts"))?;
    // Big-endian, `width` bytes, as S3 writes a CRC.
    let bytes: Vec<u8> = (0..width).rev().map(|i| (v >> (8 * i)) as u8).collect();
    Ok(b64(&bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(b: &[u8]) -> String {
        base64_simd::STANDARD.encode_to_string(b)
    }

    /// The figures ceph/s3-tests checks (three 5 MiB parts of 'A', 'B', 'C').
    #[test]
    fn parts_combine_as_s3_does() {
        let mib5 = 5u64 << 20;
        let parts = |a: &str, b: &str, c: &str| {
            vec![
                (a.to_owned(), mib5),
                (b.to_owned(), mib5),
                (c.to_owned(), mib5),
            ]
        };
        assert_eq!(
            combine(
                "CRC32",
                "FULL_OBJECT",
                &parts("JRTCyQ==", "QoZTGg==", "YAgjqw==")
            )
            .unwrap(),
            "WgDhBQ=="
        );
        assert_eq!(
            combine(
                "CRC32C",
                "FULL_OBJECT",
                &parts("MDaLrw==", "TH4EZg==", "Z7mBIQ==")
            )
            .unwrap(),
            "xU+Krw=="
        );
        assert_eq!(
            combine(
                "CRC64NVME",
                "FULL_OBJECT",
                &parts("L/E4WYn8v98=", "xW1l19VobYM=", "cK5MnNaWrW4=")
            )
            .unwrap(),
            "i+6LR0y3eFo="
        );
        assert_eq!(
            combine(
                "SHA256",
                "COMPOSITE",
                &parts(
                    "275VF5loJr1YYawit0XSHREhkFXYkkPKGuoK0x9VKxI=",
                    "mrHwOfjTL5Zwfj74F05HOQGLdUb7E5szdCbxgUSq6NM=",
                    "Vw7oB/nKQ5xWb3hNgbyfkvDiivl+U+/Dft48nfJfDow="
                )
            )
            .unwrap(),
            "uWBwpe1dxI4Vw8Gf0X9ynOdw/SS6VBzfWm9giiv1sf4=-3"
        );
    }

    /// A full-object CRC of parts equals the CRC of the whole (a canary for the combine).
    #[test]
    fn a_combined_crc_is_the_crc_of_the_whole() {
        let (a, b) = (vec![7u8; 1000], vec![9u8; 333]);
        let whole = [a.clone(), b.clone()].concat();
        let crc = |d: &[u8]| b64(&s3s::crypto::Crc32c::checksum(d));
        let parts = vec![(crc(&a), 1000), (crc(&b), 333)];
        assert_eq!(
            combine("CRC32C", "FULL_OBJECT", &parts).unwrap(),
            crc(&whole)
        );
        assert!(combine("SHA256", "FULL_OBJECT", &parts).is_err());
        assert!(combine("CRC32C", "FULL_OBJECT", &[("AA==".into(), 1)]).is_err());
    }

    #[test]
    fn upload_types_follow_the_algorithm() {
        let alg = |a: &str| ChecksumAlgorithm::from(a.to_owned());
        let t = |k: &str| ChecksumType::from(k.to_owned());
        let got = upload_checksum(Some(&alg("CRC64NVME")), None).unwrap();
        assert_eq!(got.1.as_deref(), Some("FULL_OBJECT"));
        let got = upload_checksum(Some(&alg("SHA256")), None).unwrap();
        assert_eq!(got.1.as_deref(), Some("COMPOSITE"));
        assert!(upload_checksum(Some(&alg("SHA1")), Some(&t("FULL_OBJECT"))).is_err());
        assert!(upload_checksum(None, Some(&t("COMPOSITE"))).is_err());
        assert_eq!(upload_checksum(None, None).unwrap(), (None, None));
    }
}

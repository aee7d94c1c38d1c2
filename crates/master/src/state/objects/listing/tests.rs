use super::*;
use cairn_rpc::object::ListEntry;
use std::collections::BTreeMap;

fn map(keys: &[&str]) -> BTreeMap<String, ()> {
    keys.iter().map(|k| (k.to_string(), ())).collect()
}

fn page(
    m: &BTreeMap<String, ()>,
    prefix: &str,
    delim: Option<&str>,
    after: &str,
    max: u32,
) -> (Vec<String>, Vec<String>, bool) {
    let seek = |lower: Bound<&String>| {
        m.range::<String, _>((lower, Bound::Unbounded))
            .next()
            .map(|(k, v)| (k.clone(), *v))
    };
    let p = list_keys(
        seek,
        &ListRequest {
            prefix: prefix.into(),
            delimiter: delim.map(Into::into),
            after: after.into(),
            max,
        },
        |k, _| ListEntry {
            key: k.clone(),
            size: 0,
            etag: String::new(),
            mtime_ms: 0,
            upload_id: String::new(),
            owner: String::new(),
        },
    );
    (
        p.entries.into_iter().map(|e| e.key).collect(),
        p.prefixes,
        p.truncated,
    )
}

#[test]
fn listing_with_prefix_delimiter_and_pages() {
    let m = map(&["a", "b/1", "b/2", "b/c/3", "c", "d/x", "e"]);
    let (k, p, t) = page(&m, "", Some("/"), "", 1000);
    assert_eq!(k, ["a", "c", "e"]);
    assert_eq!(p, ["b/", "d/"]);
    assert!(!t);
    let (k, p, _) = page(&m, "b/", Some("/"), "", 1000);
    assert_eq!(k, ["b/1", "b/2"]);
    assert_eq!(p, ["b/c/"]);
    // Pages of two, continuing after the last key or common prefix.
    let (k, p, t) = page(&m, "", Some("/"), "", 2);
    assert_eq!(
        (k, p, t),
        (vec!["a".to_string()], vec!["b/".to_string()], true)
    );
    let (k, p, t) = page(&m, "", Some("/"), "b/", 2);
    assert_eq!(
        (k, p, t),
        (vec!["c".to_string()], vec!["d/".to_string()], true)
    );
    let (k, p, t) = page(&m, "", Some("/"), "d/", 2);
    assert_eq!((k, p, t), (vec!["e".to_string()], vec![], false));
    // No delimiter: every key, in order.
    let (k, _, _) = page(&m, "b", None, "b/1", 1000);
    assert_eq!(k, ["b/2", "b/c/3"]);
}

#[test]
fn listing_matches_a_naive_model() {
    let keys: Vec<String> = (0..300)
        .map(|i| format!("{}/{}/{}", i % 7, i % 3, i))
        .collect();
    let m: BTreeMap<String, ()> = keys.iter().map(|k| (k.clone(), ())).collect();
    for (prefix, delim) in [("", Some("/")), ("1/", Some("/")), ("2", None), ("", None)] {
        // Naive: every key with the prefix, rolled up, deduplicated, in order.
        let mut want: Vec<String> = Vec::new();
        for k in m.keys().filter(|k| k.starts_with(prefix)) {
            let item = match delim.and_then(|d| common_prefix(k, prefix, d)) {
                Some(cp) => cp.to_owned(),
                None => k.clone(),
            };
            if want.last() != Some(&item) {
                want.push(item);
            }
        }
        for max in [1, 2, 7, 1000] {
            let mut got: Vec<String> = Vec::new();
            let mut after = String::new();
            loop {
                let (k, p, t) = page(&m, prefix, delim, &after, max);
                let mut items: Vec<String> = k.into_iter().chain(p).collect();
                items.sort();
                after = items.last().cloned().unwrap_or_default();
                got.extend(items);
                if !t {
                    break;
                }
            }
            assert_eq!(got, want, "prefix {prefix:?} delim {delim:?} max {max}");
        }
    }
}

#[test]
fn successor_skips_every_extension() {
    assert_eq!(successor("a/"), Bound::Included("a0".into()));
    assert_eq!(successor("\u{10FFFF}"), Bound::Unbounded);
    assert_eq!(successor("a\u{D7FF}"), Bound::Included("a\u{E000}".into()));
}

//! Listing keys in order with a prefix and a delimiter, a page at a time (ListObjectsV2's
//! semantics), over any ordered source of keys.

use cairn_rpc::object::{ListEntry, ListPage, ListRequest, MAX_LIST_KEYS};
use std::ops::Bound;

/// A page of keys in order (see [`ListRequest`]); memory bounded by the page. `seek` gives
/// the first key (and its value) at or after a bound.
pub fn list_keys<V>(
    seek: impl Fn(Bound<&String>) -> Option<(String, V)>,
    req: &ListRequest,
    entry: impl Fn(&String, &V) -> ListEntry,
) -> ListPage {
    let max = (req.max as usize).clamp(1, MAX_LIST_KEYS);
    let delimiter = req.delimiter.as_deref().filter(|d| !d.is_empty());
    let prefix = req.prefix.as_str();
    // Where to start: after `after`, skipping the whole common prefix it falls in.
    let mut lower: Bound<String> = if req.after.as_str() < prefix {
        Bound::Included(prefix.to_owned())
    } else {
        match delimiter.and_then(|d| common_prefix(&req.after, prefix, d)) {
            Some(cp) => successor(cp),
            None => Bound::Excluded(req.after.clone()),
        }
    };
    let mut page = ListPage::default();
    let mut count = 0;
    loop {
        let Some((key, value)) = seek(lower.as_ref()) else {
            break;
        };
        if !key.starts_with(prefix) {
            break;
        }
        if count == max {
            page.truncated = true;
            break;
        }
        count += 1;
        match delimiter.and_then(|d| common_prefix(&key, prefix, d)) {
            Some(cp) => {
                page.prefixes.push(cp.to_owned());
                page.last = Some(cp.to_owned());
                lower = successor(cp);
            }
            None => {
                page.entries.push(entry(&key, &value));
                page.last = Some(key.clone());
                lower = Bound::Excluded(key);
            }
        }
        if matches!(lower, Bound::Unbounded) {
            break;
        }
    }
    page
}

/// The common prefix `key` rolls up into: up to and including the first `delimiter` after
/// `prefix`.
pub(super) fn common_prefix<'a>(key: &'a str, prefix: &str, delimiter: &str) -> Option<&'a str> {
    let rest = key.strip_prefix(prefix)?;
    let at = rest.find(delimiter)?;
    Some(&key[..prefix.len() + at + delimiter.len()])
}

/// The least bound above every string that starts with `p` (keys order by code point, as
/// UTF-8 bytes do): `p` with its last character incremented, dropping characters that are
/// already the largest.
pub(super) fn successor(p: &str) -> Bound<String> {
    let mut s = p.to_owned();
    while let Some(c) = s.pop() {
        let next = (c as u32 + 1..=char::MAX as u32).find_map(char::from_u32);
        if let Some(n) = next {
            s.push(n);
            return Bound::Included(s);
        }
    }
    Bound::Unbounded
}

#[cfg(test)]
mod tests;

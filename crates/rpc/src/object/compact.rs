//! How an object's ETag and put id are written in the masters' store (record version 2 of
//! `objects`, docs/formats/master-state.md): in a compact format (postcard) a string of
//! lowercase hex digits of even length is its bytes (`Hex`, half the length), any other string
//! is itself (`Text`); in JSON (Raft entries, calls) it stays the string. Serde's
//! `is_human_readable` tells them apart, as std's `IpAddr` does.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

#[derive(Serialize)]
enum Out<'a> {
    Text(&'a str),
    Hex(Vec<u8>),
}

#[derive(Deserialize)]
enum In {
    Text(String),
    Hex(Vec<u8>),
}

/// `s`'s bytes when it is lowercase hex of even, non-zero length.
fn hex_bytes(s: &str) -> Option<Vec<u8>> {
    let b = s.as_bytes();
    if b.is_empty() || !b.len().is_multiple_of(2) {
        return None;
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    b.chunks_exact(2)
        .map(|p| Some(digit(p[0])? << 4 | digit(p[1])?))
        .collect()
}

fn to_hex(b: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(b.len() * 2);
    for &x in b {
        s.push(char::from(DIGITS[usize::from(x >> 4)]));
        s.push(char::from(DIGITS[usize::from(x & 15)]));
    }
    s
}

pub fn serialize<S: Serializer>(s: &str, ser: S) -> Result<S::Ok, S::Error> {
    if ser.is_human_readable() {
        return ser.serialize_str(s);
    }
    match hex_bytes(s) {
        Some(b) => Out::Hex(b).serialize(ser),
        None => Out::Text(s).serialize(ser),
    }
}

pub fn deserialize<'de, D: Deserializer<'de>>(de: D) -> Result<String, D::Error> {
    if de.is_human_readable() {
        return String::deserialize(de);
    }
    Ok(match In::deserialize(de)? {
        In::Text(s) => s,
        In::Hex(b) => to_hex(&b),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_lowercase_even_hex_is_packed() {
        assert_eq!(hex_bytes("00ff1a"), Some(vec![0, 255, 26]));
        for s in ["", "0", "0F", "abg0", "d41d8cd98f00b204e9800998ecf8427e-2"] {
            assert_eq!(hex_bytes(s), None, "{s}");
        }
        assert_eq!(to_hex(&[0, 255, 26]), "00ff1a");
    }
}

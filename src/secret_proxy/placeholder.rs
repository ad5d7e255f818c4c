//! `{{secret:NAME}}` in a header value: where the VM wants the secret
//! NAME. Found and replaced here, in bytes as they came; what NAME may be
//! and which value it gets is the caller's (`grants`).

/// How a placeholder starts and ends.
pub const OPEN: &[u8] = b"{{secret:";
pub const CLOSE: &[u8] = b"}}";

/// Whether `value` holds a placeholder's start at all (the quick test
/// every header value of an intercepted request gets).
pub fn mentions(value: &[u8]) -> bool {
    find(value, OPEN).is_some()
}

/// The secret names `value`'s placeholders give, in order. A `{{secret:`
/// whose name is not one a secret may have, or that does not end with
/// `}}`, is no placeholder, and stays as it is.
pub fn names(value: &[u8]) -> impl Iterator<Item = &str> {
    placeholders(value).map(|(_, _, name)| name)
}

/// `value` with each placeholder replaced by what `value_of` gives for
/// its name (every name has one: the caller asked `names` first).
pub fn replaced<'v>(value: &[u8], value_of: impl Fn(&str) -> &'v str) -> Vec<u8> {
    let mut out = Vec::with_capacity(value.len() + 64);
    let mut at = 0;
    for (start, end, name) in placeholders(value) {
        out.extend_from_slice(&value[at..start]);
        out.extend_from_slice(value_of(name).as_bytes());
        at = end;
    }
    out.extend_from_slice(&value[at..]);
    out
}

/// (start, end, name) of each placeholder in `value`.
fn placeholders(value: &[u8]) -> impl Iterator<Item = (usize, usize, &str)> {
    let mut at = 0;
    std::iter::from_fn(move || {
        while let Some(found) = find(&value[at..], OPEN) {
            let start = at + found;
            let name_at = start + OPEN.len();
            let len = find(&value[name_at..], CLOSE)?;
            let end = name_at + len + CLOSE.len();
            match std::str::from_utf8(&value[name_at..name_at + len]) {
                Ok(name) if crate::secrets::check_name(name).is_ok() => {
                    at = end;
                    return Some((start, end, name));
                }
                // Not a name: look again past its opening.
                _ => at = start + 1,
            }
        }
        None
    })
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(value: &str) -> Vec<&str> {
        names(value.as_bytes()).collect()
    }

    #[test]
    fn placeholders_are_found_and_replaced_and_what_is_not_one_stays() {
        let v = b"Bearer {{secret:TOKEN}}";
        assert!(mentions(v));
        assert_eq!(all("Bearer {{secret:TOKEN}}"), ["TOKEN"]);
        assert_eq!(replaced(v, |_| "s3cret"), b"Bearer s3cret");
        let two = b"{{secret:A}}:{{secret:b.c-d}}";
        assert_eq!(names(two).collect::<Vec<_>>(), ["A", "b.c-d"]);
        assert_eq!(
            replaced(two, |n| if n == "A" { "user" } else { "pass" }),
            b"user:pass"
        );
        for not_one in [
            "Bearer {{secret:}}",
            "Bearer {{secret:has space}}",
            "Bearer {{secret:TOKEN}",
            "Bearer {{secret:1TOKEN}}",
            "Bearer {{SECRET:TOKEN}}",
            "plain",
        ] {
            assert!(all(not_one).is_empty(), "{not_one}");
            assert_eq!(replaced(not_one.as_bytes(), |_| "x"), not_one.as_bytes());
        }
        // A broken one before a good one does not hide it.
        assert_eq!(all("{{secret:bad name}} {{secret:OK}}"), ["OK"]);
        assert_eq!(all("{{secret:{{secret:OK}}"), ["OK"]);
        assert!(!mentions(b"Bearer abc"));
    }
}

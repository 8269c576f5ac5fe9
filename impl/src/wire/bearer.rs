//! The `Bearer` credentials of an `Authorization` header or metadata value (RFC 9110,
//! 11.1 and 11.6.2; RFC 6750, 2.1): the scheme name is case-insensitive and one or more
//! spaces separate it from the credential. Every authenticated surface reads its
//! credential here, so none of them refuses `bearer <token>` that another accepts.

/// The credential of a `Bearer` authorization value: the bytes after the scheme (any
/// letter case) and its spaces, or `None` for another scheme, no space after it, or an
/// empty credential. The credential itself is returned as it is, never trimmed at its
/// end (a credential that differs in one byte is another credential).
pub fn bearer_credential(value: &[u8]) -> Option<&[u8]> {
    const SCHEME: &[u8] = b"bearer";
    let scheme = value.get(..SCHEME.len())?;
    if !scheme.eq_ignore_ascii_case(SCHEME) {
        return None;
    }
    let rest = &value[SCHEME.len()..];
    let spaces = rest.iter().take_while(|&&b| b == b' ').count();
    if spaces == 0 || spaces == rest.len() {
        return None;
    }
    Some(&rest[spaces..])
}

/// [`bearer_credential`] of a header value that is text.
pub fn bearer_credential_str(value: &str) -> Option<&str> {
    bearer_credential(value.as_bytes()).and_then(|c| std::str::from_utf8(c).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scheme_is_case_insensitive_and_spaces_separate_it() {
        for value in [
            "Bearer k",
            "bearer k",
            "BEARER k",
            "Bearer  k",
            "bEaReR   k",
        ] {
            assert_eq!(bearer_credential_str(value), Some("k"), "{value}");
        }
    }

    #[test]
    fn other_schemes_and_empty_credentials_are_none() {
        for value in [
            "Basic k",
            "Bearerk",
            "Bearer",
            "Bearer ",
            "Bearer   ",
            "",
            "Bear k",
            "Bearer\tk",
        ] {
            assert_eq!(bearer_credential_str(value), None, "{value:?}");
        }
        // The credential is kept whole, trailing bytes included.
        assert_eq!(bearer_credential(b"Bearer k "), Some(&b"k "[..]));
    }
}

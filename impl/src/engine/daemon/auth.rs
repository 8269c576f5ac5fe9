//! Endpoint authentication ("Initialization", "Security boundary"): "Transport middleware
//! authenticates the endpoint token from gRPC metadata before the first application
//! payload is decoded." "A random metadata token protects against accidental/ambient
//! local connections but does not defend against code already running as the same user."
//!
//! [`TokenCheck`] is a tonic interceptor: tonic runs it on the HTTP request's metadata,
//! with the body still undecoded, so an unauthenticated call never reaches a handler and
//! its payload is never parsed. An authenticated call whose `grpc-timeout` is over the
//! deadline limit is refused by the same interceptor ([`super::limits::check_deadline`]). The token is compared by digest (constant time in its
//! length), and never logged or echoed.

use std::sync::Arc;

use sha2::{Digest, Sha256};
use tonic::{Request, Status};

/// The metadata entry carrying the token, as `Bearer <token>`.
pub const AUTHORIZATION: &str = "authorization";

/// Bytes of randomness in an endpoint token (hex-encoded in the token file).
pub const TOKEN_BYTES: usize = 32;

/// A fresh random endpoint token (64 hex digits).
pub fn new_token() -> String {
    let bytes: [u8; TOKEN_BYTES] = rand::random();
    hex::encode(bytes)
}

/// Checks every call's token.
#[derive(Clone)]
pub struct TokenCheck {
    digest: Arc<[u8; 32]>,
    profile: super::Profile,
}

impl std::fmt::Debug for TokenCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenCheck(<redacted>)")
    }
}

impl TokenCheck {
    /// A check for `token`.
    pub fn new(token: &str) -> Self {
        Self {
            digest: Arc::new(Sha256::digest(token.as_bytes()).into()),
            profile: super::Profile::Reference,
        }
    }

    /// The same check, its refusals worded by `profile`.
    pub fn with_profile(mut self, profile: super::Profile) -> Self {
        self.profile = profile;
        self
    }

    fn accepts(&self, presented: &[u8]) -> bool {
        let got: [u8; 32] = Sha256::digest(presented).into();
        got.iter()
            .zip(self.digest.iter())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
    }
}

impl tonic::service::Interceptor for TokenCheck {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        let presented = request
            .metadata()
            .get(AUTHORIZATION)
            .and_then(|v| crate::wire::bearer::bearer_credential(v.as_bytes()));
        match presented {
            // An authenticated call asking for a deadline over the limit is refused here
            // too, before any handler (unary or streaming) runs.
            Some(token) if self.accepts(token) => super::limits::check_deadline(request.metadata())
                .map(|()| request)
                .map_err(|s| self.profile.refusal(s)),
            Some(_) => Err(self.profile.refusal(Status::unauthenticated(
                "token_mismatch: the endpoint token is not this daemon's",
            ))),
            None => Err(self.profile.refusal(Status::unauthenticated(
                "token_missing: the call carries no endpoint token (`authorization: Bearer <token>`)",
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::service::Interceptor;

    #[test]
    fn only_the_exact_token_passes() {
        let token = new_token();
        assert_eq!(token.len(), 2 * TOKEN_BYTES);
        let mut check = TokenCheck::new(&token);
        let with = |value: Option<String>| {
            let mut r = Request::new(());
            if let Some(v) = value {
                r.metadata_mut().insert(AUTHORIZATION, v.parse().unwrap());
            }
            r
        };
        // The scheme name is case-insensitive (RFC 9110, 11.1); the token is not.
        for good in [format!("Bearer {token}"), format!("bearer {token}")] {
            assert!(check.call(with(Some(good))).is_ok());
        }
        for bad in [
            None,
            Some(token.clone()),
            Some(format!("Bearer {token}x")),
            Some(format!("Bearer {}", token.to_uppercase())),
            Some("Bearer ".to_string()),
        ] {
            let e = check.call(with(bad.clone())).unwrap_err();
            assert_eq!(e.code(), tonic::Code::Unauthenticated, "{bad:?}");
            assert!(!e.message().contains(&token), "never echoed");
        }
        assert!(!format!("{check:?}").contains(&token));
    }
}

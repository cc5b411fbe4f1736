//! A lease's fencing token carried to the storage without code of the application's own: the
//! `Fencing-Token` and `Fencing-Resource` headers of a held lease, put on any reqwest request
//! (to fence-gateway, or storage that checks tokens itself). Nothing is sent for a lease known
//! lost.

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};

use crate::{Error, Lease, Result};

/// The header carrying the signed token.
pub const FENCING_TOKEN: HeaderName = HeaderName::from_static("fencing-token");
/// The header naming the resource the token is for.
pub const FENCING_RESOURCE: HeaderName = HeaderName::from_static("fencing-resource");
/// The older spelling fence-gateway also reads: dropped, since it refuses two tokens.
pub const X_FENCING_TOKEN: HeaderName = HeaderName::from_static("x-fencing-token");

impl Lease {
    /// `Fencing-Token` and `Fencing-Resource` of this grant. [`Error::Lost`] when the lease is
    /// lost (its deadline read from the clock). Under the client's test mode, an injected token
    /// refusal ([`crate::Fault::TokenRefusal`]) is fence-gateway's 409 `stale-fencing-token`
    /// problem as an [`Error::Problem`].
    pub fn fencing_headers(&self) -> Result<HeaderMap> {
        self.refuse_unless_held()?;
        let value = |v: &str| {
            HeaderValue::from_str(v)
                .map_err(|e| Error::Protocol(format!("not a header value: {v:?}: {e}")))
        };
        let mut headers = HeaderMap::new();
        headers.insert(FENCING_TOKEN, value(self.fencing_token())?);
        headers.insert(FENCING_RESOURCE, value(self.resource())?);
        Ok(headers)
    }

    /// `request` carrying this grant's `Fencing-Token` and `Fencing-Resource` (any
    /// `X-Fencing-Token` it had is dropped), e.g.
    /// `lease.fence(http.put(url).json(&body))?.send().await`. [`Error::Lost`] when the lease
    /// is lost, so nothing is sent (nor when the test mode refuses the token, as
    /// [`Lease::fencing_headers`] says); a request that does not build is its [`Error::Http`].
    pub fn fence(&self, request: reqwest::RequestBuilder) -> Result<reqwest::RequestBuilder> {
        let headers = self.fencing_headers()?;
        let (client, built) = request.build_split();
        let mut built = built?;
        built.headers_mut().remove(X_FENCING_TOKEN);
        built.headers_mut().extend(headers);
        Ok(reqwest::RequestBuilder::from_parts(client, built))
    }
}

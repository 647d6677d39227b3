//! The bounds and security headers every response carries, and the console's own script and
//! style (the only ones its CSP allows).

use super::*;

/// The largest request body accepted (forms are a few hundred bytes).
pub(crate) const MAX_BODY_BYTES: usize = 16 * 1024;

/// The Content-Security-Policy: the console's own script and style only, no inline script, no
/// framing, forms posting only to the console.
pub(crate) const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

const SCRIPT: &str = include_str!("../../static/console.js");
const STYLE: &str = include_str!("../../static/console.css");

/// Security headers on every response; a change whose `Origin` is not this console refused
/// before any handler runs.
pub(super) async fn guard(request: Request, next: Next) -> Response {
    if request.method() == Method::POST && !same_origin(request.headers()) {
        let mut r = refused(StatusCode::FORBIDDEN, "the request came from another site");
        secure(r.headers_mut());
        return r;
    }
    let mut response = next.run(request).await;
    secure(response.headers_mut());
    response
}

fn secure(h: &mut HeaderMap) {
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
}

/// Whether the `Origin` (when the browser sends one) names the host the request was sent to.
fn same_origin(h: &HeaderMap) -> bool {
    let Some(origin) = h.get(header::ORIGIN).and_then(|o| o.to_str().ok()) else {
        return true;
    };
    let host = h
        .get(header::HOST)
        .and_then(|o| o.to_str().ok())
        .unwrap_or_default();
    let origin_host = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"))
        .unwrap_or_default();
    !host.is_empty() && origin_host == host
}

pub(super) async fn script() -> Response {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        SCRIPT,
    )
        .into_response()
}

pub(super) async fn style() -> Response {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], STYLE).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_post_from_another_site_is_not_same_origin() {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("127.0.0.1:8089"));
        assert!(same_origin(&h));
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://127.0.0.1:8089"),
        );
        assert!(same_origin(&h));
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://evil.example"),
        );
        assert!(!same_origin(&h));
    }
}

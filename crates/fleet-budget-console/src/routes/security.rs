//! The bounds and security headers every response carries, and the console's own script and
//! style (the only ones its CSP allows).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Extension;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::ConsoleError;
use super::extract::session;
use crate::App;
use crate::access::{Counters, Denied};

/// A refusal of the guard, as its page.
fn refused(status: StatusCode, why: &str) -> Response {
    ConsoleError::Status(status, why.to_owned()).into_response()
}

/// The largest request body accepted (forms are a few hundred bytes).
pub(crate) const MAX_BODY_BYTES: usize = 16 * 1024;
/// The longest request target (path and query) answered; longer ones get 414 from the guard.
/// (hyper answers 414 itself, without our headers, past 65,534 bytes.)
pub(crate) const MAX_URI_BYTES: usize = 8 * 1024;
/// The most header lines answered; more get 431 from the guard (hyper answers 431 itself
/// past 200).
pub(crate) const MAX_HEADERS: usize = 100;
/// The most bytes of header names and values answered; more get 431 from the guard (hyper
/// answers 431 itself past a 128 KiB head).
pub(crate) const MAX_HEAD_BYTES: usize = 32 * 1024;

/// The Content-Security-Policy: the console's own script and style only, no inline script, no
/// framing, forms posting only to the console.
pub(crate) const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

const SCRIPT: &str = include_str!("../../static/console.js");
const STYLE: &str = include_str!("../../static/console.css");

/// The client's address, as the login limits count it (the peer's, or a trusted proxy's
/// client): set by [`guard`] on every request.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Client(pub(crate) IpAddr);

/// Before any handler: the bounds of the head (414, 431), the Host allow-list (421), a change
/// whose `Origin` is not this console (403), the body read within its deadline and size (408,
/// 413); after: the security headers, on every response, refusals included, and the server's
/// time on it ([`server_timing`]).
pub(super) async fn guard(State(app): State<Arc<App>>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    let mut response = match admit(&app, request).await {
        Ok(request) => next.run(request).await,
        Err(refusal) => refusal,
    };
    secure(response.headers_mut());
    response
        .headers_mut()
        .insert(SERVER_TIMING, server_timing(started.elapsed()));
    response
}

/// `Server-Timing`, the W3C header a browser shows its page through the Performance API
/// (`performance.getEntriesByType('navigation')[0].serverTiming`).
const SERVER_TIMING: HeaderName = HeaderName::from_static("server-timing");

/// The `Server-Timing` value of an answer that took `took` in the console: `app;dur=12.345`,
/// milliseconds from the request's head read to the answer's head, its body rendered (every
/// page is rendered whole before it is sent), the reads of Redis and RabbitMQ it waited for
/// included; the network and the client's reading of the body are not.
fn server_timing(took: Duration) -> HeaderValue {
    let value = format!("app;dur={:.3}", took.as_secs_f64() * 1000.0);
    HeaderValue::from_str(&value).unwrap_or_else(|_| HeaderValue::from_static("app"))
}

async fn admit(app: &App, mut request: Request) -> Result<Request, Response> {
    let uri_len = request
        .uri()
        .path_and_query()
        .map_or(0, |p| p.as_str().len());
    if uri_len > MAX_URI_BYTES {
        return Err(refused(
            StatusCode::URI_TOO_LONG,
            &format!("the address is {uri_len} bytes long; at most {MAX_URI_BYTES} are read"),
        ));
    }
    let h = request.headers();
    let head_bytes: usize = h.iter().map(|(k, v)| k.as_str().len() + v.len()).sum();
    if h.len() > MAX_HEADERS || head_bytes > MAX_HEAD_BYTES {
        return Err(refused(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            &format!(
                "{} header lines, {head_bytes} bytes; at most {MAX_HEADERS} lines and \
                 {MAX_HEAD_BYTES} bytes are read",
                h.len()
            ),
        ));
    }
    let host = h
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .or_else(|| request.uri().authority().map(|a| a.as_str()))
        .unwrap_or_default();
    if !host_allowed(&app.settings, host) {
        Counters::add(&app.counters.hosts_refused);
        tracing::warn!(
            host = %fleet_budget::printable::escape_text(&host.chars().take(200).collect::<String>()),
            "console: a request for another host refused (DNS rebinding?)"
        );
        return Err(refused(
            StatusCode::MISDIRECTED_REQUEST,
            "this console does not answer for that host name: open it by its bind address \
             or its --public-url",
        ));
    }
    if request.method() == Method::POST && !from_this_console(&app.settings, request.headers()) {
        return Err(refused(
            StatusCode::FORBIDDEN,
            "the request came from another site",
        ));
    }
    let peer = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map_or(SocketAddr::from(([0, 0, 0, 0], 0)), |c| c.0);
    let client = crate::server::client_address(
        peer,
        &app.settings.trusted_proxies,
        request
            .headers()
            .get("x-forwarded-for")
            .and_then(|v| v.to_str().ok()),
    );
    request.extensions_mut().insert(Client(client));
    // The body, whole, within its deadline and size: a handler never waits on a client.
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let too_large = || {
        refused(
            StatusCode::PAYLOAD_TOO_LARGE,
            &format!("the body is larger than {MAX_BODY_BYTES} bytes"),
        )
    };
    if declared.is_some_and(|n| n > MAX_BODY_BYTES as u64) {
        return Err(closing(too_large()));
    }
    let (parts, body) = request.into_parts();
    let read = async {
        let mut stream = body.into_data_stream();
        let mut bytes = Vec::new();
        while let Some(chunk) = futures::StreamExt::next(&mut stream).await {
            let chunk = chunk.map_err(|_| None)?;
            if bytes.len() + chunk.len() > MAX_BODY_BYTES {
                return Err(Some(()));
            }
            bytes.extend_from_slice(&chunk);
        }
        Ok(bytes)
    };
    match tokio::time::timeout(app.settings.limits.body_timeout, read).await {
        Ok(Ok(bytes)) => Ok(Request::from_parts(parts, axum::body::Body::from(bytes))),
        Ok(Err(Some(()))) => Err(closing(too_large())),
        Ok(Err(None)) => Err(closing(refused(
            StatusCode::BAD_REQUEST,
            "the body could not be read",
        ))),
        Err(_) => {
            Counters::add(&app.counters.timed_out_body);
            Err(closing(refused(
                StatusCode::REQUEST_TIMEOUT,
                &format!(
                    "the body did not arrive within {:?}",
                    app.settings.limits.body_timeout
                ),
            )))
        }
    }
}

/// `r`, and the connection closed after it (what is left of the request is not read).
fn closing(mut r: Response) -> Response {
    r.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    r
}

/// Whether a change comes from this console's own pages: no `Origin` (not a browser's
/// cross-site request), or one naming the host the request was sent to or the public URL.
pub(crate) fn from_this_console(settings: &crate::ConsoleSettings, h: &HeaderMap) -> bool {
    same_origin(h) || public_origin(settings, h)
}

/// Whether the `Origin` is the public URL's (a proxy that does not pass the `Host` on).
fn public_origin(settings: &crate::ConsoleSettings, h: &HeaderMap) -> bool {
    let (Some(url), Some(origin)) = (
        settings.public_url.as_ref(),
        h.get(header::ORIGIN).and_then(|o| o.to_str().ok()),
    ) else {
        return false;
    };
    let scheme = if url.https() { "https://" } else { "http://" };
    origin
        .strip_prefix(scheme)
        .is_some_and(|rest| host_part(rest).eq_ignore_ascii_case(url.host()))
}

/// The host of a `Host` value (`name`, `name:port`, `[v6]:port`), without the port.
pub(crate) fn host_part(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or_default();
    }
    match host.rsplit_once(':') {
        Some((h, port)) if port.chars().all(|c| c.is_ascii_digit()) => h,
        _ => host,
    }
}

/// Whether a request for `host` is answered: the bind address's IP (any IP when bound to
/// all interfaces), `localhost` when bound to loopback or all interfaces, and the public
/// URL's host. Any other name may be a DNS-rebinding page's: the name is the attacker's, the
/// address ours. Ports are not compared (a proxy may forward any).
pub(crate) fn host_allowed(settings: &crate::ConsoleSettings, host: &str) -> bool {
    let name = host_part(host.trim()).to_ascii_lowercase();
    if name.is_empty() {
        return false;
    }
    if settings
        .public_url
        .as_ref()
        .is_some_and(|u| u.host().trim_start_matches('[').trim_end_matches(']') == name)
    {
        return true;
    }
    let bind = settings.bind.ip();
    if let Ok(ip) = name.parse::<IpAddr>() {
        return bind.is_unspecified() || ip.to_canonical() == bind.to_canonical();
    }
    name == "localhost" && (bind.is_loopback() || bind.is_unspecified())
}

/// The cookie attributes: `Secure` when browsers come over https (`--public-url https://`).
pub(crate) fn cookie_attributes(app: &App) -> &'static str {
    if app.settings.public_url.as_ref().is_some_and(|u| u.https()) {
        "HttpOnly; SameSite=Strict; Secure"
    } else {
        "HttpOnly; SameSite=Strict"
    }
}

/// `/metrics`: the console's counters (Prometheus text). Read like any page (a session, or an
/// open console), or with `Authorization: Bearer TOKEN` (a viewer's or an operator's token,
/// under the same login limits), for a scraper.
pub(super) async fn metrics(
    State(app): State<Arc<App>>,
    Extension(client): Extension<Client>,
    h: HeaderMap,
) -> Response {
    let bearer = h
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let allowed = match bearer {
        Some(token) => match app.access.check(client.0, token) {
            Ok(_) => true,
            Err(d) => {
                login_failed(&app, client.0, &d, "metrics");
                return ConsoleError::from(d).into_response();
            }
        },
        None => app.access.reader(session(&h)).await.is_ok(),
    };
    if !allowed {
        return ConsoleError::from(Denied::NotLoggedIn).into_response();
    }
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        app.counters.render(),
    )
        .into_response()
}

/// A refused login, logged (never the token) and counted.
pub(super) fn login_failed(app: &App, client: IpAddr, d: &Denied, via: &str) {
    let reason = d.login_reason();
    Counters::add(match d {
        Denied::AddressLimited => &app.counters.login_address_limited,
        Denied::LabelLimited => &app.counters.login_label_limited,
        _ => &app.counters.login_wrong_token,
    });
    tracing::warn!(client = %client, reason, via, "console: login refused");
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
    use axum::http::{HeaderMap, HeaderValue, header};

    use super::{host_allowed, same_origin, server_timing};

    #[test]
    fn the_server_timing_is_the_app_s_milliseconds() {
        let v = server_timing(std::time::Duration::from_micros(12_345));
        assert_eq!(v.to_str().ok(), Some("app;dur=12.345"));
        let v = server_timing(std::time::Duration::ZERO);
        assert_eq!(v.to_str().ok(), Some("app;dur=0.000"));
    }

    #[test]
    fn hosts_are_the_bind_address_and_the_public_url() {
        let config = fleet_budget_amqp::WorkerConfig::from_toml("", "t");
        let Ok(config) = config else {
            unreachable!("an empty configuration is valid")
        };
        let mut s = crate::ConsoleSettings::new(config, Vec::new(), crate::Viewers::Open);
        assert!(host_allowed(&s, "127.0.0.1:8089"));
        assert!(host_allowed(&s, "localhost:8089"));
        assert!(!host_allowed(&s, "evil.example:8089"));
        assert!(!host_allowed(&s, "10.1.2.3:8089"));
        assert!(!host_allowed(&s, ""));
        s.public_url = crate::PublicUrl::parse("https://Console.Example.com/x").ok();
        assert!(host_allowed(&s, "console.example.com"));
        assert!(host_allowed(&s, "CONSOLE.example.com:443"));
        assert!(!host_allowed(&s, "console.example.com.evil.example"));
        s.bind = "[::]:8089".parse().unwrap_or(s.bind);
        assert!(host_allowed(&s, "[2001:db8::1]:8089"));
        assert!(host_allowed(&s, "10.1.2.3"));
        assert!(!host_allowed(&s, "rebind.evil.example"));
        assert!(crate::PublicUrl::parse("ftp://x").is_err());
        assert!(crate::PublicUrl::parse("https://u:p@x").is_err());
        assert!(crate::PublicUrl::parse("https://").is_err());
    }

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

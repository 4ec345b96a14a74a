//! Which request the console serves, decided by its path: the page's static files to anyone who
//! names this console, the key exchange to the holder of the printed key, and calls (which act
//! with the operator's token) only as gRPC-Web POSTs within a session. Every other request, and
//! every other method on these paths, is refused before anything is forwarded.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse as _, Response};
use tokio::sync::Semaphore;
use tonic_types::{ErrorDetails, StatusExt as _};

use super::assets;
use super::session::{NotExchanged, SESSION_LIFETIME, Sessions};

/// The header that carries the printed key, once, to [`EXCHANGE_PATH`].
pub(super) const KEY_HEADER: &str = "x-idempost-console-key";

/// Where the page exchanges the printed key for a session.
pub(super) const EXCHANGE_PATH: &str = "/session";

/// The services whose calls are forwarded, as the first segment of a call's path.
const CALL_PREFIXES: [&str; 2] = ["/idempost.v1.AdminService/", "/idempost.v1.ConsumerAdminService/"];

/// What every request is checked against.
#[derive(Debug)]
pub(super) struct Site {
    /// `Host` values that name this console.
    pub(super) hosts: Vec<String>,
    /// The session cookie's name: it names the port, since browsers keep one cookie jar for every
    /// port of a host and two consoles must not overwrite each other's.
    pub(super) cookie: String,
    pub(super) sessions: Mutex<Sessions>,
    pub(super) permits: Arc<Semaphore>,
}

impl Site {
    pub(super) fn new(hosts: Vec<String>, port: u16, permits: usize) -> Self {
        Self {
            hosts,
            cookie: format!("idempost_console_{port}"),
            sessions: Mutex::default(),
            permits: Arc::new(Semaphore::new(permits)),
        }
    }

    /// A new one-time key for the URL.
    pub(super) fn issue_key(&self) -> String {
        self.locked().issue_key(Instant::now())
    }

    fn locked(&self) -> std::sync::MutexGuard<'_, Sessions> {
        // The state stays consistent whatever panicked while holding it: every change is one push
        // or one removal.
        self.sessions.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Admits a request (see the module's documentation) and puts the security headers on its answer.
pub(super) async fn guard(State(site): State<Arc<Site>>, request: Request, next: Next) -> Response {
    let Ok(_permit) = site.permits.clone().try_acquire_owned() else {
        return (StatusCode::SERVICE_UNAVAILABLE, "the console is busy").into_response();
    };
    let mut response = match judge(&site, &request) {
        Verdict::Serve => next.run(request).await,
        Verdict::Answer(answer) => answer,
    };
    let headers = response.headers_mut();
    for (name, value) in [
        (header::CONTENT_SECURITY_POLICY, assets::CONTENT_SECURITY_POLICY),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::CACHE_CONTROL, "no-store"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

/// What becomes of a request.
#[derive(Debug)]
enum Verdict {
    Serve,
    /// Answered here: a refusal, or the key exchange's answer.
    Answer(Response),
}

fn judge(site: &Site, request: &Request) -> Verdict {
    let headers = request.headers();
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or_default();
    if !site.hosts.iter().any(|known| known == host) {
        return answer(StatusCode::MISDIRECTED_REQUEST, "not this console's address");
    }
    if let Some(origin) = headers.get(header::ORIGIN)
        && origin.to_str().ok() != Some(format!("http://{host}").as_str())
    {
        return answer(StatusCode::FORBIDDEN, "not this console's page");
    }
    let path = request.uri().path();
    let method = request.method();
    if assets::PATHS.contains(&path) {
        if method == Method::GET || method == Method::HEAD {
            return Verdict::Serve;
        }
        return not_allowed("GET, HEAD");
    }
    if path == EXCHANGE_PATH {
        if method != Method::POST {
            return not_allowed("POST");
        }
        return exchange(site, request);
    }
    if !CALL_PREFIXES.iter().any(|prefix| path.starts_with(prefix)) {
        return answer(StatusCode::NOT_FOUND, "not a page or call of this console");
    }
    if method != Method::POST {
        return not_allowed("POST");
    }
    let content_type = headers.get(header::CONTENT_TYPE).map(HeaderValue::as_bytes).unwrap_or_default();
    if !matches!(content_type, b"application/grpc-web" | b"application/grpc-web+proto") {
        return answer(StatusCode::UNSUPPORTED_MEDIA_TYPE, "the console takes gRPC-Web calls only");
    }
    let session = session_cookie(headers, &site.cookie);
    if site.locked().admits(session.unwrap_or_default().as_bytes(), Instant::now()) {
        return Verdict::Serve;
    }
    Verdict::Answer(no_session())
}

/// The answer to `POST /session`: a session cookie for the printed key, once.
fn exchange(site: &Site, request: &Request) -> Verdict {
    let presented = request.headers().get(KEY_HEADER).map(HeaderValue::as_bytes).unwrap_or_default();
    let outcome = site.locked().exchange(presented, Instant::now());
    match outcome {
        Ok(session) => {
            let cookie = format!(
                "{}={session}; Max-Age={}; Path=/; HttpOnly; SameSite=Strict",
                site.cookie,
                SESSION_LIFETIME.as_secs()
            );
            let Ok(cookie) = HeaderValue::from_str(&cookie) else {
                return answer(StatusCode::INTERNAL_SERVER_ERROR, "the session cookie is not a header");
            };
            Verdict::Answer((StatusCode::NO_CONTENT, [(header::SET_COOKIE, cookie)]).into_response())
        }
        Err(NotExchanged::Spent) => answer(
            StatusCode::FORBIDDEN,
            "CONSOLE_KEY_SPENT: this URL's key was used already or expired; press Enter in the \
             terminal running idempostctl console for a new URL",
        ),
        Err(NotExchanged::Unknown) => answer(
            StatusCode::FORBIDDEN,
            "CONSOLE_KEY_UNKNOWN: not the key idempostctl console printed last; open its latest URL",
        ),
    }
}

/// The value of the cookie `name`, when the request carries it.
fn session_cookie<'a>(headers: &'a axum::http::HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find_map(|(key, value)| (key == name).then_some(value))
}

/// A call without a session, refused as the page's gRPC-Web client reads any refusal.
fn no_session() -> Response {
    let details = ErrorDetails::with_error_info("CONSOLE_SESSION_MISSING", "idempost.v1", []);
    let status = tonic::Status::with_error_details(
        tonic::Code::Unauthenticated,
        "this page has no console session: open a new URL from idempostctl console",
        details,
    );
    let mut refusal: Response = status.into_http();
    refusal
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/grpc-web+proto"));
    refusal
}

fn answer(status: StatusCode, text: &'static str) -> Verdict {
    Verdict::Answer((status, text).into_response())
}

fn not_allowed(allowed: &'static str) -> Verdict {
    let refused =
        (StatusCode::METHOD_NOT_ALLOWED, [(header::ALLOW, allowed)], "not a method this path takes");
    Verdict::Answer(refused.into_response())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn site() -> Site {
        Site::new(vec!["127.0.0.1:8485".into(), "localhost:8485".into()], 8485, 1)
    }

    fn request(method: Method, path: &str, headers: &[(&str, &str)]) -> Request {
        let mut request = axum::http::Request::builder().method(method).uri(path);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request.body(axum::body::Body::empty()).unwrap()
    }

    fn status(verdict: Verdict) -> Option<StatusCode> {
        match verdict {
            Verdict::Serve => None,
            Verdict::Answer(answer) => Some(answer.status()),
        }
    }

    const HOST: (&str, &str) = ("host", "127.0.0.1:8485");
    const CALL: &str = "/idempost.v1.AdminService/ListBacklog";
    const GRPC_WEB: (&str, &str) = ("content-type", "application/grpc-web+proto");

    #[test]
    fn the_page_needs_no_key_but_only_by_get_and_only_for_this_console() {
        let site = site();
        let verdict =
            |method, path, headers: &[(&str, &str)]| status(judge(&site, &request(method, path, headers)));
        assert_eq!(verdict(Method::GET, "/", &[HOST]), None);
        assert_eq!(verdict(Method::HEAD, "/console.js", &[("host", "localhost:8485")]), None);
        assert_eq!(verdict(Method::POST, "/", &[HOST]), Some(StatusCode::METHOD_NOT_ALLOWED));
        assert_eq!(
            verdict(Method::GET, "/", &[("host", "rebound.example:8485")]),
            Some(StatusCode::MISDIRECTED_REQUEST)
        );
        assert_eq!(verdict(Method::GET, "/elsewhere", &[HOST]), Some(StatusCode::NOT_FOUND));
    }

    #[test]
    fn a_call_is_a_grpc_web_post_within_a_session_from_this_page() {
        let site = site();
        let key = site.issue_key();
        let exchanged = judge(&site, &request(Method::POST, EXCHANGE_PATH, &[HOST, (KEY_HEADER, &key)]));
        let Verdict::Answer(exchanged) = exchanged else { panic!("the exchange is answered here") };
        let set = exchanged.headers()[header::SET_COOKIE].to_str().unwrap().to_owned();
        let cookie = set.split(';').next().unwrap().to_owned();
        assert!(
            set.contains("HttpOnly") && set.contains("SameSite=Strict") && set.contains("Path=/"),
            "{set}"
        );
        let cookie = ("cookie", cookie.as_str());
        let verdict =
            |method, headers: &[(&str, &str)]| status(judge(&site, &request(method, CALL, headers)));

        assert_eq!(verdict(Method::POST, &[HOST, GRPC_WEB, cookie]), None);
        assert_eq!(verdict(Method::GET, &[HOST, GRPC_WEB, cookie]), Some(StatusCode::METHOD_NOT_ALLOWED));
        assert_eq!(verdict(Method::HEAD, &[HOST]), Some(StatusCode::METHOD_NOT_ALLOWED));
        let grpc = ("content-type", "application/grpc");
        assert_eq!(verdict(Method::POST, &[HOST, grpc, cookie]), Some(StatusCode::UNSUPPORTED_MEDIA_TYPE));
        let other_page = ("origin", "http://evil.example");
        assert_eq!(verdict(Method::POST, &[HOST, GRPC_WEB, cookie, other_page]), Some(StatusCode::FORBIDDEN));
        let sessionless = judge(&site, &request(Method::POST, CALL, &[HOST, GRPC_WEB, (KEY_HEADER, &key)]));
        let Verdict::Answer(sessionless) = sessionless else { panic!("a key is not a session") };
        assert_eq!(sessionless.headers()["grpc-status"], "16", "refused as a gRPC call: UNAUTHENTICATED");
        let again = judge(&site, &request(Method::POST, EXCHANGE_PATH, &[HOST, (KEY_HEADER, &key)]));
        assert_eq!(status(again), Some(StatusCode::FORBIDDEN), "the key is spent");
    }

    #[test]
    fn the_session_cookie_is_found_among_others() {
        let mut headers = axum::http::HeaderMap::new();
        headers.append(header::COOKIE, HeaderValue::from_static("a=1; idempost_console_8485=s3ss"));
        headers.append(header::COOKIE, HeaderValue::from_static("idempost_console_9=other"));
        assert_eq!(session_cookie(&headers, "idempost_console_8485"), Some("s3ss"));
        assert_eq!(session_cookie(&headers, "idempost_console_1"), None);
    }
}

//! Who may look and who may change: tokens, sessions, CSRF and the rate of actions.
//!
//! Why sessions and not the token on every request: a browser cannot attach a bearer token to
//! a form without script, and a token kept in the page's storage is readable by any script that
//! gets in. The token is typed once on `/login`, compared in constant time against every token
//! configured, and exchanged for a random session id in an `HttpOnly`, `SameSite=Strict`
//! cookie; the session carries the token's label (what the audit trail names, never the token)
//! and a CSRF token of its own, which every form carries back and every change checks.
//!
//! Logins are limited twice, and never by one bucket for everyone (issue 32: 20 wrong tokens
//! from anywhere locked every operator out): failed logins per client address (an address that
//! failed [`LOGIN_FAILURES_PER_ADDRESS`] times is refused, right token or wrong, until its
//! bucket refills; a correct token from another address is never refused for them), and
//! successful logins per token label ([`LOGINS_PER_LABEL`] a minute, at most
//! [`SESSIONS_PER_LABEL`] live sessions: a label's next login ends its own oldest session, so
//! one token cannot fill the table against the others). Only holders of a token consume its
//! label's bucket.
//!
//! Sessions are bounded in number (labels × [`SESSIONS_PER_LABEL`]) and in age. The token is
//! never stored in a session, printed or logged.
//!
//! Sessions outlive a restart of the console (issue 32: a restart logged everyone out): each is
//! kept in Redis too, under the console's key prefix (`session_key`), named by the SHA-256 of
//! its id (the cookie's value is never stored) and expiring with the session. A restarted
//! console finds a session there on its first request and keeps it only while the token that
//! opened it is still configured under the same label and role: the record holds a SHA-256 of
//! the session id and the token together, which only a request carrying the id can check, so a
//! token taken out of the configuration ends its sessions at the next restart. Redis down costs
//! nothing but that: the sessions of this process live in its memory first.

use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use std::sync::Arc;

use fleet_budget::store::RedisStore;
use rand::RngCore;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// The shortest token accepted, in bytes: shorter ones are guessable at the login's rate.
pub const MIN_TOKEN_BYTES: usize = 16;
/// Failed logins one client address may make in a minute (refilled evenly over the minute);
/// past them the address is refused, whatever the token, until its bucket refills. IPv6
/// addresses count by their /64 (one host usually holds a whole /64).
pub const LOGIN_FAILURES_PER_ADDRESS: u32 = 10;
/// Successful logins one token label may make in a minute.
pub const LOGINS_PER_LABEL: u32 = 30;
/// Live sessions one token label may hold; a login past them ends the label's oldest session.
pub const SESSIONS_PER_LABEL: usize = 100;
/// Client addresses whose failures are remembered at once. When full, the addresses whose
/// buckets have refilled are forgotten first, then the one with the fewest recent failures:
/// a flood of addresses weakens the limit for the flood, never locks out anyone else.
const MAX_ADDRESSES: usize = 10_000;
/// A session ends this long after its login.
const SESSION_AGE: Duration = Duration::from_secs(12 * 3600);
/// The name of the session cookie.
pub(crate) const SESSION_COOKIE: &str = "fbc_session";
/// The name of the cookie that ties the login form to its browser (login CSRF).
pub(crate) const LOGIN_COOKIE: &str = "fbc_login";

/// A token and the label the audit trail records for whoever uses it.
#[derive(Clone)]
pub struct Token {
    label: String,
    secret: Vec<u8>,
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the secret.
        f.debug_struct("Token")
            .field("label", &self.label)
            .finish_non_exhaustive()
    }
}

/// A token list that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// No token in the text.
    #[error("{origin}: no token (one a line: `TOKEN` or `LABEL:TOKEN`)")]
    Empty {
        /// Where the tokens came from (a file's path or a variable's name).
        origin: String,
    },
    /// A token too short to resist guessing.
    #[error("{origin}, line {line}: the token is shorter than {MIN_TOKEN_BYTES} bytes")]
    TooShort {
        /// Where.
        origin: String,
        /// Which line (1-based).
        line: usize,
    },
}

impl Token {
    /// Reads tokens from `text`, one a line: `TOKEN` (labelled `default_label`) or
    /// `LABEL:TOKEN` (a label is 1 to 64 letters, digits, `-`, `_`, `.` or `@`; a line whose
    /// part before `:` is not one is a token whole); blank lines and lines starting with `#` are skipped.
    ///
    /// # Errors
    /// No token, or a token under [`MIN_TOKEN_BYTES`].
    pub fn parse_list(
        text: &str,
        default_label: &str,
        origin: &str,
    ) -> Result<Vec<Self>, TokenError> {
        let mut tokens = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (label, secret) = match line.split_once(':') {
                Some((label, secret)) if is_label(label) => (label, secret),
                _ => (default_label, line),
            };
            if secret.len() < MIN_TOKEN_BYTES {
                return Err(TokenError::TooShort {
                    origin: origin.to_owned(),
                    line: i + 1,
                });
            }
            tokens.push(Self {
                label: label.to_owned(),
                secret: secret.as_bytes().to_vec(),
            });
        }
        if tokens.is_empty() {
            return Err(TokenError::Empty {
                origin: origin.to_owned(),
            });
        }
        Ok(tokens)
    }

    /// The label the audit trail records.
    #[must_use]
    pub fn label(&self) -> &str {
        &self.label
    }
}

fn is_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.@".contains(c))
}

/// Who may read.
#[derive(Debug, Clone)]
pub enum Viewers {
    /// Anyone who reaches the console reads (`--no-viewer-token`); changes still need an
    /// operator's login.
    Open,
    /// Only a login with one of these tokens (or an operator's) reads.
    Tokens(Vec<Token>),
}

/// What a session may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Reads only.
    Viewer,
    /// Reads and changes.
    Operator,
}

/// A reader or changer, as the pages and the audit see them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Visitor {
    /// The token's label (`anonymous` on an open console without a login).
    pub(crate) label: String,
    pub(crate) role: Role,
    /// The session's CSRF token (`None` without a session).
    pub(crate) csrf: Option<String>,
    /// The fleet's risky settings, which every page shows it (filled by the extractor).
    pub(crate) risks: Arc<Vec<crate::pages::risks::Risk>>,
}

#[derive(Debug, Clone)]
struct Session {
    label: String,
    role: Role,
    csrf: String,
    /// When it ends (Unix ms: the record in Redis outlives this process's clock).
    ends_ms: u64,
}

impl Role {
    fn as_str(self) -> &'static str {
        match self {
            Self::Viewer => "viewer",
            Self::Operator => "operator",
        }
    }
}

/// The Redis key of the session whose id hashes to `hash` (hex SHA-256), under the fleet's key
/// prefix: `<prefix>:v1:console:session:<hash>` (after `v1:` comes `c`, never `{`: never a
/// budget key).
pub(crate) fn session_key(prefix: &str, hash: &str) -> String {
    format!(
        "{prefix}:v{}:console:session:{hash}",
        fleet_budget::keys::KEY_SCHEMA_VERSION
    )
}

/// Hex SHA-256 of `parts`, each followed by a NUL.
fn sha256_hex(parts: &[&[u8]]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p);
        h.update([0u8]);
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// Why a request may not go on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Denied {
    /// No (live) session where one is needed.
    NotLoggedIn,
    /// Logged in, but not as an operator.
    NotOperator,
    /// The form's CSRF token is missing or not the session's.
    Csrf,
    /// Too many actions in the last minute.
    TooMany,
    /// Too many failed logins from this client address in the last minute.
    AddressLimited,
    /// Too many logins with this token (label) in the last minute.
    LabelLimited,
}

impl Denied {
    /// The `reason` label of `fleet_budget_console_login_failures_total` for a refused login.
    pub(crate) fn login_reason(&self) -> &'static str {
        match self {
            Self::AddressLimited => "address_limited",
            Self::LabelLimited => "label_limited",
            _ => "wrong_token",
        }
    }
}

/// Counters of the console's `/metrics` (bounded labels: the reasons are fixed).
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) login_wrong_token: AtomicU64,
    pub(crate) login_address_limited: AtomicU64,
    pub(crate) login_label_limited: AtomicU64,
    pub(crate) login_stale_form: AtomicU64,
    pub(crate) logins: AtomicU64,
    pub(crate) hosts_refused: AtomicU64,
    pub(crate) timed_out_header: AtomicU64,
    pub(crate) timed_out_body: AtomicU64,
    pub(crate) timed_out_write: AtomicU64,
    pub(crate) conns_refused_per_address: AtomicU64,
    pub(crate) conns_refused_full: AtomicU64,
    pub(crate) conns_evicted: AtomicU64,
    pub(crate) conns_open: AtomicU64,
}

impl Counters {
    pub(crate) fn add(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// The Prometheus text exposition.
    pub(crate) fn render(&self) -> String {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let mut out = String::new();
        let mut family = |name: &str, kind: &str, help: &str, series: &[(&str, u64)]| {
            out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
            for (labels, v) in series {
                out.push_str(&format!("{name}{labels} {v}\n"));
            }
        };
        family(
            "fleet_budget_console_login_failures_total",
            "counter",
            "Logins refused, by reason.",
            &[
                ("{reason=\"wrong_token\"}", g(&self.login_wrong_token)),
                (
                    "{reason=\"address_limited\"}",
                    g(&self.login_address_limited),
                ),
                ("{reason=\"label_limited\"}", g(&self.login_label_limited)),
                ("{reason=\"stale_form\"}", g(&self.login_stale_form)),
            ],
        );
        family(
            "fleet_budget_console_logins_total",
            "counter",
            "Logins that opened a session.",
            &[("", g(&self.logins))],
        );
        family(
            "fleet_budget_console_hosts_refused_total",
            "counter",
            "Requests refused for a Host header not on the allow-list.",
            &[("", g(&self.hosts_refused))],
        );
        family(
            "fleet_budget_console_timeouts_total",
            "counter",
            "Connections or requests ended by a read or write deadline, by phase.",
            &[
                ("{phase=\"header\"}", g(&self.timed_out_header)),
                ("{phase=\"body\"}", g(&self.timed_out_body)),
                ("{phase=\"write\"}", g(&self.timed_out_write)),
            ],
        );
        family(
            "fleet_budget_console_connections_refused_total",
            "counter",
            "Connections closed on arrival or evicted to make room, by reason.",
            &[
                (
                    "{reason=\"per_address\"}",
                    g(&self.conns_refused_per_address),
                ),
                ("{reason=\"full\"}", g(&self.conns_refused_full)),
                ("{reason=\"evicted_idle\"}", g(&self.conns_evicted)),
            ],
        );
        family(
            "fleet_budget_console_connections_open",
            "gauge",
            "Connections open now.",
            &[("", g(&self.conns_open))],
        );
        out
    }
}

/// Tokens, sessions and the action rate.
pub(crate) struct Access {
    operators: Vec<Token>,
    viewers: Viewers,
    /// The live sessions of this process, by the hash of their id.
    sessions: Mutex<HashMap<String, Session>>,
    /// Where sessions are kept across restarts (`None`: in memory only).
    store: Option<Arc<RedisStore>>,
    actions: Mutex<Bucket>,
    login_limits: LoginLimits,
    limits: Mutex<LoginBuckets>,
}

/// The login limits (defaults: [`LOGIN_FAILURES_PER_ADDRESS`] failures per address and
/// [`LOGINS_PER_LABEL`] logins per label, each refilled evenly over a minute).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoginLimits {
    /// Failed logins one client address may make per `window`.
    pub failures_per_address: u32,
    /// Successful logins one token label may make per `window`.
    pub logins_per_label: u32,
    /// Over how long each allowance refills, evenly.
    pub window: Duration,
}

impl Default for LoginLimits {
    fn default() -> Self {
        Self {
            failures_per_address: LOGIN_FAILURES_PER_ADDRESS,
            logins_per_label: LOGINS_PER_LABEL,
            window: Duration::from_secs(60),
        }
    }
}

/// The login limits: failures per client address, logins per label.
#[derive(Debug, Default)]
struct LoginBuckets {
    failures: HashMap<IpAddr, Bucket>,
    per_label: HashMap<String, Bucket>,
}

/// The key an address's failures count under: IPv4 as is (an IPv4-mapped IPv6 address as its
/// IPv4), IPv6 by its /64.
pub(crate) fn address_key(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => {
            let mut o = v6.octets();
            if let Some(host) = o.get_mut(8..) {
                host.fill(0);
            }
            IpAddr::from(o)
        }
        v4 => v4,
    }
}

impl Access {
    pub(crate) fn new(
        operators: Vec<Token>,
        viewers: Viewers,
        actions_per_minute: u32,
        login_limits: LoginLimits,
        store: Option<Arc<RedisStore>>,
    ) -> Self {
        Self {
            operators,
            viewers,
            sessions: Mutex::new(HashMap::new()),
            store,
            actions: Mutex::new(Bucket::per_minute(actions_per_minute)),
            login_limits,
            limits: Mutex::new(LoginBuckets::default()),
        }
    }

    /// Whether reading needs no login.
    pub(crate) fn open_to_viewers(&self) -> bool {
        matches!(self.viewers, Viewers::Open)
    }

    /// The role and label of `presented`, compared in constant time with every token (the
    /// loop does not stop at a match, so the time does not say which token matched).
    fn role_of(&self, presented: &[u8]) -> Option<(Role, String)> {
        let mut found = None;
        for t in &self.operators {
            if bool::from(t.secret.ct_eq(presented)) && found.is_none() {
                found = Some((Role::Operator, t.label.clone()));
            }
        }
        if let Viewers::Tokens(viewers) = &self.viewers {
            for t in viewers {
                if bool::from(t.secret.ct_eq(presented)) && found.is_none() {
                    found = Some((Role::Viewer, t.label.clone()));
                }
            }
        }
        found
    }

    /// The role and label of `presented`, sent from `client`: refused without comparing when
    /// the address has used up its failures; a wrong token counts against the address.
    /// `Denied::NotLoggedIn` is a wrong token.
    pub(crate) fn check(&self, client: IpAddr, presented: &str) -> Result<(Role, String), Denied> {
        let key = address_key(client);
        let now = Instant::now();
        {
            let mut limits = lock(&self.limits);
            if limits
                .failures
                .get_mut(&key)
                .is_some_and(|b| b.level_at(now) < 1.0)
            {
                return Err(Denied::AddressLimited);
            }
        }
        if let Some(found) = self.role_of(presented.trim().as_bytes()) {
            return Ok(found);
        }
        let mut limits = lock(&self.limits);
        if !limits.failures.contains_key(&key) && limits.failures.len() >= MAX_ADDRESSES {
            limits.failures.retain(|_, b| b.level_at(now) < b.capacity);
            if limits.failures.len() >= MAX_ADDRESSES {
                let fullest = limits
                    .failures
                    .iter()
                    .max_by(|a, b| a.1.level.total_cmp(&b.1.level))
                    .map(|(k, _)| *k);
                if let Some(k) = fullest {
                    limits.failures.remove(&k);
                }
            }
        }
        limits
            .failures
            .entry(key)
            .or_insert_with(|| {
                Bucket::new(
                    self.login_limits.failures_per_address,
                    self.login_limits.window,
                )
            })
            .take();
        Err(Denied::NotLoggedIn)
    }

    /// Exchanges a token sent from `client` for a new session: its id (the cookie's value),
    /// the role and the token's label.
    pub(crate) async fn login(
        &self,
        client: IpAddr,
        presented: &str,
    ) -> Result<(String, Role, String), Denied> {
        let (role, label) = self.check(client, presented)?;
        {
            let mut limits = lock(&self.limits);
            let bucket = limits.per_label.entry(label.clone()).or_insert_with(|| {
                Bucket::new(self.login_limits.logins_per_label, self.login_limits.window)
            });
            if !bucket.take() {
                return Err(Denied::LabelLimited);
            }
        }
        let now = fleet_budget::clock::now_ms();
        let id = random_hex();
        let hash = sha256_hex(&[id.as_bytes()]);
        let session = Session {
            label: label.clone(),
            role,
            csrf: random_hex(),
            ends_ms: now + millis(SESSION_AGE),
        };
        let ended = {
            let mut sessions = lock(&self.sessions);
            sessions.retain(|_, s| s.ends_ms > now);
            let mut own: Vec<(u64, String)> = sessions
                .iter()
                .filter(|(_, s)| s.label == label)
                .map(|(h, s)| (s.ends_ms, h.clone()))
                .collect();
            let mut ended = Vec::new();
            if own.len() >= SESSIONS_PER_LABEL {
                own.sort();
                for (_, h) in own.iter().take(own.len() + 1 - SESSIONS_PER_LABEL) {
                    sessions.remove(h);
                    ended.push(h.clone());
                }
            }
            sessions.insert(hash.clone(), session.clone());
            ended
        };
        self.persist(&id, &hash, &session, presented.trim().as_bytes())
            .await;
        for h in ended {
            self.forget(&h).await;
        }
        Ok((id, role, label))
    }

    /// Keeps `session` in Redis until it ends (a failure is logged: the session lives on in
    /// this process).
    async fn persist(&self, id: &str, hash: &str, session: &Session, secret: &[u8]) {
        let Some(store) = &self.store else { return };
        let ttl = session
            .ends_ms
            .saturating_sub(fleet_budget::clock::now_ms());
        let mut cmd = redis::cmd("HSET");
        cmd.arg(session_key(store.prefix(), hash))
            .arg("label")
            .arg(&session.label)
            .arg("role")
            .arg(session.role.as_str())
            .arg("csrf")
            .arg(&session.csrf)
            .arg("ends_ms")
            .arg(session.ends_ms)
            .arg("bind")
            .arg(sha256_hex(&[id.as_bytes(), secret]));
        let mut expire = redis::cmd("PEXPIRE");
        expire
            .arg(session_key(store.prefix(), hash))
            .arg(ttl.max(1));
        let kept = async {
            store.query::<()>(&cmd).await?;
            store.query::<()>(&expire).await
        }
        .await;
        if let Err(e) = kept {
            tracing::warn!(
                error = %fleet_budget::redact::redact_text(&e.to_string()),
                "console: a session was not kept in Redis (it ends if the console restarts)"
            );
        }
    }

    /// Drops the session of hash `hash` from Redis.
    async fn forget(&self, hash: &str) {
        let Some(store) = &self.store else { return };
        let mut cmd = redis::cmd("DEL");
        cmd.arg(session_key(store.prefix(), hash));
        if let Err(e) = store.query::<()>(&cmd).await {
            tracing::warn!(
                error = %fleet_budget::redact::redact_text(&e.to_string()),
                "console: an ended session was not removed from Redis (it expires by itself)"
            );
        }
    }

    /// Ends the session `id`.
    pub(crate) async fn logout(&self, id: &str) {
        let hash = sha256_hex(&[id.as_bytes()]);
        lock(&self.sessions).remove(&hash);
        self.forget(&hash).await;
    }

    /// Who sends a request whose session cookie is `session`: may they read?
    pub(crate) async fn reader(&self, session: Option<&str>) -> Result<Visitor, Denied> {
        let found = match session {
            Some(id) => self.session(id).await,
            None => None,
        };
        if let Some(s) = found {
            return Ok(Visitor {
                label: s.label,
                role: s.role,
                csrf: Some(s.csrf),
                risks: Arc::default(),
            });
        }
        if self.open_to_viewers() {
            return Ok(Visitor {
                label: "anonymous".to_owned(),
                role: Role::Viewer,
                csrf: None,
                risks: Arc::default(),
            });
        }
        Err(Denied::NotLoggedIn)
    }

    /// Who sends a change: an operator's session whose CSRF token is `csrf`, within the rate
    /// of actions. Returns the label to audit.
    pub(crate) async fn changer(
        &self,
        session: Option<&str>,
        csrf: Option<&str>,
    ) -> Result<String, Denied> {
        let found = match session {
            Some(id) => self.session(id).await,
            None => None,
        };
        let s = found.ok_or(Denied::NotLoggedIn)?;
        let given = csrf.unwrap_or_default().as_bytes();
        if !bool::from(s.csrf.as_bytes().ct_eq(given)) {
            return Err(Denied::Csrf);
        }
        if s.role != Role::Operator {
            return Err(Denied::NotOperator);
        }
        if !lock(&self.actions).take() {
            return Err(Denied::TooMany);
        }
        Ok(s.label)
    }

    /// The live session `id`: this process's, else one a console before it kept in Redis
    /// (then kept here too).
    async fn session(&self, id: &str) -> Option<Session> {
        // Looked up by the hash of the id: a guess that misses learns nothing from the time
        // but that it missed.
        let hash = sha256_hex(&[id.as_bytes()]);
        let now = fleet_budget::clock::now_ms();
        if let Some(s) = lock(&self.sessions).get(&hash) {
            return (s.ends_ms > now).then(|| s.clone());
        }
        let restored = self.restore(id, &hash, now).await?;
        let mut sessions = lock(&self.sessions);
        let own = sessions
            .values()
            .filter(|s| s.label == restored.label)
            .count();
        if own < SESSIONS_PER_LABEL {
            sessions.insert(hash, restored.clone());
        }
        Some(restored)
    }

    /// The session `id` kept in Redis, if it is live and the token that opened it is still
    /// configured with the same label and role.
    async fn restore(&self, id: &str, hash: &str, now: u64) -> Option<Session> {
        let store = self.store.as_ref()?;
        let mut cmd = redis::cmd("HGETALL");
        cmd.arg(session_key(store.prefix(), hash));
        let fields: HashMap<String, String> = match store.query(&cmd).await {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!(
                    error = %fleet_budget::redact::redact_text(&e.to_string()),
                    "console: a session could not be looked up in Redis"
                );
                return None;
            }
        };
        let field = |k: &str| fields.get(k).map(String::as_str).unwrap_or_default();
        let role = match field("role") {
            "operator" => Role::Operator,
            "viewer" => Role::Viewer,
            _ => return None,
        };
        let ends_ms = field("ends_ms").parse::<u64>().ok()?;
        if ends_ms <= now || field("csrf").len() != 32 {
            return None;
        }
        let label = field("label");
        let bind = field("bind").as_bytes();
        let tokens: &[Token] = match (role, &self.viewers) {
            (Role::Operator, _) => &self.operators,
            (Role::Viewer, Viewers::Tokens(v)) => v,
            (Role::Viewer, Viewers::Open) => &[],
        };
        let mut still = false;
        for t in tokens {
            let expected = sha256_hex(&[id.as_bytes(), &t.secret]);
            still |= t.label == label && bool::from(expected.as_bytes().ct_eq(bind));
        }
        still.then(|| Session {
            label: label.to_owned(),
            role,
            csrf: field("csrf").to_owned(),
            ends_ms,
        })
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A token bucket: `capacity` takes, refilled evenly over `window`.
#[derive(Debug)]
struct Bucket {
    capacity: f64,
    level: f64,
    at: Instant,
    window_secs: f64,
}

impl Bucket {
    fn per_minute(n: u32) -> Self {
        Self::new(n, Duration::from_secs(60))
    }

    fn new(n: u32, window: Duration) -> Self {
        let capacity = f64::from(n.max(1));
        Self {
            capacity,
            level: capacity,
            at: Instant::now(),
            window_secs: window.as_secs_f64().max(0.001),
        }
    }

    /// The level now, refilled.
    fn level_at(&mut self, now: Instant) -> f64 {
        let refill =
            now.saturating_duration_since(self.at).as_secs_f64() * self.capacity / self.window_secs;
        self.level = (self.level + refill).min(self.capacity);
        self.at = now;
        self.level
    }

    fn take(&mut self) -> bool {
        if self.level_at(Instant::now()) >= 1.0 {
            self.level -= 1.0;
            true
        } else {
            false
        }
    }
}

/// 128 random bits in hex.
pub(crate) fn random_hex() -> String {
    let mut bytes = [0u8; 16];
    rand::rng().fill_bytes(&mut bytes);
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A lock that a panic elsewhere did not make unusable (the data are counters and sessions,
/// consistent at every step).
pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The value of cookie `name` in a `Cookie` header.
pub(crate) fn cookie<'a>(header: Option<&'a str>, name: &str) -> Option<&'a str> {
    header?
        .split(';')
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn operator() -> Vec<Token> {
        Token::parse_list("ann:0123456789abcdef0123", "operator", "t").unwrap_or_default()
    }

    #[test]
    fn tokens_are_read_with_their_labels_and_short_ones_refused() {
        let t = Token::parse_list(
            "# ops\nann:0123456789abcdef\n\nfedcba9876543210x\n",
            "operator",
            "f",
        );
        let t = t.unwrap_or_default();
        assert_eq!(t.len(), 2);
        assert_eq!(t.first().map(Token::label), Some("ann"));
        assert_eq!(t.get(1).map(Token::label), Some("operator"));
        assert!(!format!("{t:?}").contains("0123456789abcdef"));
        assert_eq!(
            Token::parse_list("short", "operator", "f").err(),
            Some(TokenError::TooShort {
                origin: "f".into(),
                line: 1
            })
        );
        assert!(matches!(
            Token::parse_list("\n# none\n", "o", "f"),
            Err(TokenError::Empty { .. })
        ));
    }

    #[tokio::test]
    async fn a_change_needs_the_operator_session_and_its_csrf_token() {
        let viewers =
            Token::parse_list("vic:viewer-token-0123456", "viewer", "v").unwrap_or_default();
        let access = Access::new(operator(), Viewers::Tokens(viewers), 100, HOUR, None);
        assert_eq!(access.reader(None).await, Err(Denied::NotLoggedIn));
        assert_eq!(
            access.login(A, "wrong-token-0123456789").await.err(),
            Some(Denied::NotLoggedIn)
        );
        let Ok((id, role, _)) = access.login(A, "0123456789abcdef0123").await else {
            unreachable!("the operator's token logs in")
        };
        assert_eq!(role, Role::Operator);
        let csrf = access
            .reader(Some(&id))
            .await
            .ok()
            .and_then(|v| v.csrf)
            .unwrap_or_default();
        assert_eq!(access.changer(Some(&id), None).await, Err(Denied::Csrf));
        assert_eq!(
            access.changer(Some(&id), Some("nope")).await,
            Err(Denied::Csrf)
        );
        assert_eq!(
            access.changer(Some(&id), Some(&csrf)).await,
            Ok("ann".to_owned())
        );
        let Ok((vid, _, _)) = access.login(A, "viewer-token-0123456").await else {
            unreachable!("the viewer's token logs in")
        };
        let vcsrf = access
            .reader(Some(&vid))
            .await
            .ok()
            .and_then(|v| v.csrf)
            .unwrap_or_default();
        assert_eq!(
            access.changer(Some(&vid), Some(&vcsrf)).await,
            Err(Denied::NotOperator)
        );
        access.logout(&id).await;
        assert_eq!(
            access.changer(Some(&id), Some(&csrf)).await,
            Err(Denied::NotLoggedIn)
        );
    }

    /// Limits that refill over an hour: what a test reads does not depend on its speed.
    const HOUR: LoginLimits = LoginLimits {
        failures_per_address: LOGIN_FAILURES_PER_ADDRESS,
        logins_per_label: LOGINS_PER_LABEL,
        window: Duration::from_secs(3600),
    };
    const A: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 1));
    const B: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 2));

    #[tokio::test]
    async fn a_strangers_failures_lock_out_only_the_strangers_address() {
        let access = Access::new(operator(), Viewers::Open, 100, HOUR, None);
        let mut refused = 0;
        for _ in 0..25 {
            match access.login(A, "wrong-token-0123456789").await {
                Err(Denied::NotLoggedIn) => {}
                Err(Denied::AddressLimited) => refused += 1,
                other => unreachable!("{other:?}"),
            }
        }
        assert_eq!(refused, 25 - LOGIN_FAILURES_PER_ADDRESS as usize);
        // A's own correct token waits for A's bucket; B's is never refused.
        assert_eq!(
            access.login(A, "0123456789abcdef0123").await.err(),
            Some(Denied::AddressLimited)
        );
        assert!(access.login(B, "0123456789abcdef0123").await.is_ok());
        // An IPv6 host counts by its /64.
        let v6a: IpAddr = "2001:db8::1".parse().unwrap_or(A);
        let v6b: IpAddr = "2001:db8::2".parse().unwrap_or(A);
        assert_eq!(address_key(v6a), address_key(v6b));
        assert_eq!(address_key("::ffff:10.0.0.1".parse().unwrap_or(B)), A);
    }

    #[tokio::test]
    async fn a_label_logs_in_a_bounded_number_of_times_and_keeps_a_bounded_number_of_sessions() {
        let viewers =
            Token::parse_list("vic:viewer-token-0123456", "viewer", "v").unwrap_or_default();
        let access = Access::new(operator(), Viewers::Tokens(viewers), 100, HOUR, None);
        let mut first = None;
        for _ in 0..LOGINS_PER_LABEL {
            let Ok((id, _, label)) = access.login(A, "0123456789abcdef0123").await else {
                unreachable!("within the label's rate")
            };
            assert_eq!(label, "ann");
            first.get_or_insert(id);
        }
        assert_eq!(
            access.login(A, "0123456789abcdef0123").await.err(),
            Some(Denied::LabelLimited)
        );
        assert!(access.login(A, "viewer-token-0123456").await.is_ok());
        assert!(access.reader(first.as_deref()).await.is_ok());
        assert!(lock(&access.sessions).len() <= SESSIONS_PER_LABEL * 2);
    }

    #[tokio::test]
    async fn actions_are_rate_limited() {
        let access = Access::new(operator(), Viewers::Open, 2, HOUR, None);
        let Ok((id, _, _)) = access.login(A, "0123456789abcdef0123").await else {
            unreachable!("the operator's token logs in")
        };
        let csrf = access
            .reader(Some(&id))
            .await
            .ok()
            .and_then(|v| v.csrf)
            .unwrap_or_default();
        assert!(access.changer(Some(&id), Some(&csrf)).await.is_ok());
        assert!(access.changer(Some(&id), Some(&csrf)).await.is_ok());
        assert_eq!(
            access.changer(Some(&id), Some(&csrf)).await,
            Err(Denied::TooMany)
        );
    }

    #[test]
    fn cookies_are_found_by_name() {
        assert_eq!(
            cookie(Some("a=1; fbc_session=xyz"), SESSION_COOKIE),
            Some("xyz")
        );
        assert_eq!(cookie(Some("a=1"), SESSION_COOKIE), None);
    }
}

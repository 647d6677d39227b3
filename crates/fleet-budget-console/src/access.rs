//! Who may look and who may change: tokens, sessions, CSRF and the rate of actions.
//!
//! Why sessions and not the token on every request: a browser cannot attach a bearer token to
//! a form without script, and a token kept in the page's storage is readable by any script that
//! gets in. The token is typed once on `/login`, compared in constant time against every token
//! configured, and exchanged for a random session id in an `HttpOnly`, `SameSite=Strict`
//! cookie; the session carries the token's label (what the audit trail names, never the token)
//! and a CSRF token of its own, which every form carries back and every change checks.
//!
//! Sessions are bounded in number and in age; a full table refuses new logins rather than
//! forgetting live sessions. The token is never stored in a session, printed or logged.

use std::collections::HashMap;
use std::fmt;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rand::RngCore;
use subtle::ConstantTimeEq;

/// The shortest token accepted, in bytes: shorter ones are guessable at the login's rate.
pub const MIN_TOKEN_BYTES: usize = 16;
/// At most this many sessions live at once.
const MAX_SESSIONS: usize = 1_000;
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
}

#[derive(Debug, Clone)]
struct Session {
    label: String,
    role: Role,
    csrf: String,
    ends: Instant,
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
    /// Too many actions or logins in the last minute.
    TooMany,
    /// The login table is full.
    Full,
}

/// Tokens, sessions and the action rate.
pub(crate) struct Access {
    operators: Vec<Token>,
    viewers: Viewers,
    sessions: Mutex<HashMap<String, Session>>,
    actions: Mutex<Bucket>,
    logins: Mutex<Bucket>,
}

impl Access {
    pub(crate) fn new(operators: Vec<Token>, viewers: Viewers, actions_per_minute: u32) -> Self {
        Self {
            operators,
            viewers,
            sessions: Mutex::new(HashMap::new()),
            actions: Mutex::new(Bucket::per_minute(actions_per_minute)),
            logins: Mutex::new(Bucket::per_minute(20)),
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

    /// Exchanges a token for a new session: its id (the cookie's value).
    pub(crate) fn login(&self, presented: &str) -> Result<(String, Role), Denied> {
        if !lock(&self.logins).take() {
            return Err(Denied::TooMany);
        }
        let (role, label) = self
            .role_of(presented.trim().as_bytes())
            .ok_or(Denied::NotLoggedIn)?;
        let mut sessions = lock(&self.sessions);
        let now = Instant::now();
        sessions.retain(|_, s| s.ends > now);
        if sessions.len() >= MAX_SESSIONS {
            return Err(Denied::Full);
        }
        let id = random_hex();
        sessions.insert(
            id.clone(),
            Session {
                label,
                role,
                csrf: random_hex(),
                ends: now + SESSION_AGE,
            },
        );
        Ok((id, role))
    }

    /// Ends the session `id`.
    pub(crate) fn logout(&self, id: &str) {
        lock(&self.sessions).remove(id);
    }

    /// Who sends a request whose session cookie is `session`: may they read?
    pub(crate) fn reader(&self, session: Option<&str>) -> Result<Visitor, Denied> {
        if let Some(s) = session.and_then(|id| self.session(id)) {
            return Ok(Visitor {
                label: s.label,
                role: s.role,
                csrf: Some(s.csrf),
            });
        }
        if self.open_to_viewers() {
            return Ok(Visitor {
                label: "anonymous".to_owned(),
                role: Role::Viewer,
                csrf: None,
            });
        }
        Err(Denied::NotLoggedIn)
    }

    /// Who sends a change: an operator's session whose CSRF token is `csrf`, within the rate
    /// of actions. Returns the label to audit.
    pub(crate) fn changer(
        &self,
        session: Option<&str>,
        csrf: Option<&str>,
    ) -> Result<String, Denied> {
        let s = session
            .and_then(|id| self.session(id))
            .ok_or(Denied::NotLoggedIn)?;
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

    fn session(&self, id: &str) -> Option<Session> {
        let sessions = lock(&self.sessions);
        // The id is looked up by hash; a guess that misses learns nothing from the time but
        // that it missed.
        sessions
            .get(id)
            .filter(|s| s.ends > Instant::now())
            .cloned()
    }
}

/// A token bucket: `capacity` takes, refilled evenly over a minute.
#[derive(Debug)]
struct Bucket {
    capacity: f64,
    level: f64,
    at: Instant,
}

impl Bucket {
    fn per_minute(n: u32) -> Self {
        let capacity = f64::from(n.max(1));
        Self {
            capacity,
            level: capacity,
            at: Instant::now(),
        }
    }

    fn take(&mut self) -> bool {
        let now = Instant::now();
        let refill = now.duration_since(self.at).as_secs_f64() * self.capacity / 60.0;
        self.level = (self.level + refill).min(self.capacity);
        self.at = now;
        if self.level >= 1.0 {
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

    #[test]
    fn a_change_needs_the_operator_session_and_its_csrf_token() {
        let viewers =
            Token::parse_list("vic:viewer-token-0123456", "viewer", "v").unwrap_or_default();
        let access = Access::new(operator(), Viewers::Tokens(viewers), 100);
        assert_eq!(access.reader(None), Err(Denied::NotLoggedIn));
        assert_eq!(
            access.login("wrong-token-0123456789").err(),
            Some(Denied::NotLoggedIn)
        );
        let Ok((id, role)) = access.login("0123456789abcdef0123") else {
            unreachable!("the operator's token logs in")
        };
        assert_eq!(role, Role::Operator);
        let csrf = access
            .reader(Some(&id))
            .ok()
            .and_then(|v| v.csrf)
            .unwrap_or_default();
        assert_eq!(access.changer(Some(&id), None), Err(Denied::Csrf));
        assert_eq!(access.changer(Some(&id), Some("nope")), Err(Denied::Csrf));
        assert_eq!(access.changer(Some(&id), Some(&csrf)), Ok("ann".to_owned()));
        let Ok((vid, _)) = access.login("viewer-token-0123456") else {
            unreachable!("the viewer's token logs in")
        };
        let vcsrf = access
            .reader(Some(&vid))
            .ok()
            .and_then(|v| v.csrf)
            .unwrap_or_default();
        assert_eq!(
            access.changer(Some(&vid), Some(&vcsrf)),
            Err(Denied::NotOperator)
        );
        access.logout(&id);
        assert_eq!(
            access.changer(Some(&id), Some(&csrf)),
            Err(Denied::NotLoggedIn)
        );
    }

    #[test]
    fn actions_are_rate_limited() {
        let access = Access::new(operator(), Viewers::Open, 2);
        let Ok((id, _)) = access.login("0123456789abcdef0123") else {
            unreachable!("the operator's token logs in")
        };
        let csrf = access
            .reader(Some(&id))
            .ok()
            .and_then(|v| v.csrf)
            .unwrap_or_default();
        assert!(access.changer(Some(&id), Some(&csrf)).is_ok());
        assert!(access.changer(Some(&id), Some(&csrf)).is_ok());
        assert_eq!(access.changer(Some(&id), Some(&csrf)), Err(Denied::TooMany));
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
